"""What the sim-to-real apps (fidelity, obs_gap, the GPU race) share: the scenario both backends
play, the controllers they compare, each backend's env, and one recorded episode.

Controllers are named as in ``conf/controller/`` and built by the one factory
:func:`dynamix_gym.controllers.make_controller`. A config lists them as entries, each a name, or a
one-key mapping ``{name: {parameter overrides}}``, with an optional ``label`` beside the key::

    controllers:
      - {static: {batch: 16}}                        # python -m experiments.evaluate controller=static controller.batch=16
      - dlb
      - ppo                                          # the app's pretrained bundle (its ``ppo.path``)
      - {ppo: {path: results/headline/policy}, label: ppo-cifar10}
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.utils import to_absolute_path

from adapters.config import real_config_of
from dynamix_gym.configs import plain
from dynamix_gym.controllers import make_controller
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import controller_label, run_episode
from dynamix_gym.obs.v4 import SCHEMA_VERSION_V4
from sim.faults import FaultWindow, Scenario
from sim.profile import ClusterProfile, load_profile


def build_scenario(doc: Any, profile: ClusterProfile) -> Scenario:
    """The scenario of a config's ``scenario`` mapping (name, description, worker_speed, windows,
    compute_noise_cv; a null noise: the profile's measured per-iteration spread, else 0.03)."""
    s = plain(doc)
    cv = s.get("compute_noise_cv")
    if cv is None:
        cv = (profile.meta.get("measured") or {}).get("compute_noise_cv") or 0.03
    return Scenario(
        name=str(s.get("name", "fidelity")),
        description=str(s.get("description", "")),
        worker_speed=tuple(float(x) for x in s.get("worker_speed") or ()),
        windows=tuple(FaultWindow(**w) for w in s.get("windows") or ()),
        compute_noise_cv=float(min(max(cv, 0.0), 1.0)),
    )


def real_profile(ref: str) -> tuple[ClusterProfile, dict[str, Any]]:
    """The profile (a directory or a name) and the real backend config it was measured on."""
    profile = load_profile(Path(to_absolute_path(ref)) if os.sep in ref else ref)
    return profile, real_config_of(profile)


def parse_controller(entry: Any) -> tuple[str, dict[str, Any], str | None]:
    """``(name, parameter overrides, label or None)`` of one controller entry (module docstring)."""
    entry = plain(entry)
    if isinstance(entry, str):
        return entry, {}, None
    if not isinstance(entry, dict):
        raise ValueError(f"a controller entry is a name or {{name: {{overrides}}}}, got {entry!r}")
    rest = {k: v for k, v in entry.items() if k != "label"}
    if len(rest) != 1:
        raise ValueError(f"a controller entry names one controller (and an optional label), got {entry!r}")
    ((name, kwargs),) = rest.items()
    label = entry.get("label")
    return str(name), dict(kwargs or {}), None if label is None else str(label)


def controller_specs(
    entries: Iterable[Any], initial_batch: int, ppo_path: str | None
) -> list[dict[str, Any]]:
    """One spec per controller entry: its label, factory name and parameters, the local batch of its
    first interval (a static controller's own batch, else ``initial_batch``) and, for a static one,
    that batch. PPO entries without a ``path`` get ``ppo_path``; with neither they are left out."""
    specs = []
    for entry in entries:
        name, kwargs, label = parse_controller(entry)
        if name == "ppo":
            if ppo_path is None and "path" not in kwargs:
                continue
            kwargs = {"path": ppo_path, **kwargs}
        static = name == "static"
        batch = int(kwargs["batch"]) if static else None
        specs.append(
            {
                "label": label or controller_label(make_controller(name, **kwargs)),
                "name": name,
                "kwargs": kwargs,
                "initial_batch": batch if static else int(initial_batch),
                "static": static,
                "batch": batch,
            }
        )
    return specs


def spec_controller(spec: dict[str, Any]) -> Any:
    """A fresh controller of a spec (:func:`controller_specs`)."""
    return make_controller(spec["name"], **spec["kwargs"])


class RealEnvs:
    """Real DDP backends for the scenario, one per initial batch and set of config overrides (e.g.
    ``lr_rule``), kept alive across episodes; ``extra`` fields apply to every backend."""

    def __init__(
        self,
        real_config: dict[str, Any],
        scenario: Scenario,
        budget_s: float,
        compute_profile: str | None = None,
        **extra: Any,
    ) -> None:
        #: the profile (measured right before, in a deployment campaign) whose compute curve the ranks'
        #: spec carries for a controller of observation schema 4 (the others read none)
        self.compute_profile = compute_profile
        self.base = {
            **real_config,
            "scenario": scenario,
            "fault_time_scale": 1.0,
            "time_budget_s": budget_s,
            **extra,
        }
        self.backends: dict[tuple, Any] = {}

    def env(
        self,
        initial_batch: int | None,
        action_mode: str,
        interval: int,
        reward: str,
        env_kwargs: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> HeteroClusterEnv:
        """The env over the backend of ``initial_batch`` and ``overrides``; ``env_kwargs`` are the
        controller's own env options (a bundle's ``obs_schema`` and ``action_set``)."""
        from adapters.config import RealDDPConfig
        from adapters.ddp_backend import DDPBackend

        if (
            str((env_kwargs or {}).get("obs_schema")) == SCHEMA_VERSION_V4
            and self.compute_profile is not None
        ):
            overrides = {"compute_profile": self.compute_profile, **overrides}
        key = (initial_batch, *sorted(overrides.items()))
        if key not in self.backends:
            self.backends[key] = DDPBackend(
                RealDDPConfig(**{**self.base, "initial_batch": initial_batch, **overrides})
            )
        return HeteroClusterEnv(
            backend=self.backends[key],
            action_mode=action_mode,
            interval=interval,
            reward=reward,
            **dict(env_kwargs or {}),
        )

    def close(self) -> None:
        for be in self.backends.values():
            be.close()


def sim_env(
    profile: ClusterProfile,
    scenario: Scenario,
    initial_batch: int,
    action_mode: str,
    interval: int,
    reward: str,
    budget_s: float,
    env_kwargs: dict[str, Any] | None = None,
) -> HeteroClusterEnv:
    return HeteroClusterEnv(
        profile=profile,
        scenario=scenario,
        initial_batch=initial_batch,
        action_mode=action_mode,
        interval=interval,
        reward=reward,
        time_budget_s=budget_s,
        **dict(env_kwargs or {}),
    )


#: A guarded run's summary counts (:meth:`sim.guards.Guard.summary`) that :func:`run_one` keeps.
GUARD_KEYS = (
    "guard_mode",
    "guard_firings",
    "guard_rollbacks",
    "guard_time_lost_s",
    "guard_fallback_intervals",
)


def run_one(
    env: HeteroClusterEnv,
    spec: dict[str, Any],
    seed: int,
    backend: str,
    scenario: str,
    controller: Any | None = None,
) -> dict[str, Any]:
    """One episode of the spec's controller (``controller``, if the caller built it already: a
    bundle is loaded once): its summary row and (key ``timeline``) its timeline."""
    ctrl = controller if controller is not None else spec_controller(spec)
    res = run_episode(env, ctrl, seed, scenario=scenario)
    s = res.summary
    timeline = pd.DataFrame(res.timeline)
    timeline.insert(0, "seed", seed)
    timeline.insert(0, "backend", backend)
    timeline.insert(0, "controller", spec["label"])
    return {
        "controller": spec["label"],
        "backend": backend,
        "seed": seed,
        "reached": bool(s["reached_target"]),
        "tta_s": float(s["time_to_accuracy_s"]) if s["reached_target"] else math.nan,
        "total_time_s": float(s["total_time_s"]),
        "final_accuracy": float(s["final_accuracy"]),
        "decisions": int(s["decisions"]),
        "steps": (int(s["decisions"]) + 1) * int(env.unwrapped.interval),
        "decision_time_ms": float(s["decision_time_ms"]),
        "mean_idle_fraction": float(s["mean_idle_fraction"]),
        "batch_changes": int(s["batch_changes"]),
        # what a guarded backend's guards did (sim.guards; absent for an unguarded one), and the
        # inputs a bundle read far out of its training range (absent for other controllers)
        **{k: s[k] for k in (*GUARD_KEYS, "inputs_out_of_range") if k in s},
        "timeline": timeline,
    }
