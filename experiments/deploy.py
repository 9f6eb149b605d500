"""Deploy a controller (a baseline or a PPO bundle) on real PyTorch DDP training.

    python -m experiments.deploy controller=dlb
    python -m experiments.deploy policy=pollux backend.workers=3 backend.emulate=null
    DYNAMIX_ARBITRATOR_TOKEN=... python -m experiments.deploy arbitrator=127.0.0.1:50051 +arbitrator_kwargs.job_id=ddp-4

The env is ``dynamix/RealDDP-v0`` built from ``conf/backend/real.yaml`` with the same specs and
episode runner (:func:`dynamix_gym.evaluation.run_episode`) as ``experiments.evaluate``, so the
run dir gets the same ``timeline.csv`` and ``summary.csv`` row. With ``backend.checkpoint_dir``
and ``backend.checkpoint_every`` the model, optimiser, data position and the controller are saved
atomically; ``backend.resume=true`` continues a crashed run from its last checkpoint (the
timeline's steps then continue from the checkpoint's interval).

With ``arbitrator=`` a job the service refuses (wrong token, unknown bundle) fails with the
service's cause, unless ``+arbitrator_kwargs.allow_without_policy=true``; a job that loses the
service keeps its batches and warns at once. Either way the timeline flags every interval whose
batches were kept without the policy (``without_policy``), the summary counts them
(``decisions_without_policy``) and the closing log line says how many there were.

With ``calibrate.quick=true`` the run starts with a quick step-time ladder on its own ranks (at
most ``calibrate.max_s``, 60 s), the stored profile (``calibrate.profile``, default the bundle's
training profile) refitted into ``<run dir>/profile_refit`` (knee included) and refused when its step
times drift more than ``calibrate.max_drift`` (10%) from the refit, unless ``calibrate.refuse=false``
(:mod:`experiments.deploy_calibration`). With ``finetune=true`` as well, a PPO bundle is then
fine-tuned in the refitted simulator for a bounded time and deployed instead only if it beats the
bundle on held-out simulated seeds of that profile (:mod:`experiments.deploy_finetune`).

Returns the time to accuracy in seconds (``inf`` when the target was not reached).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

import dynamix_gym  # noqa: F401  (registers the envs)
from adapters.ddp_backend import DDPBackend
from dynamix_gym.controllers.base import BaseController, decided_without_policy, env_options, hooks
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.evaluation import run_episode
from dynamix_gym.obs.v4 import MISSING_CURVE, SCHEMA_VERSION_V4
from experiments.common import atomic_write_text, plain
from experiments.deploy_calibration import REFIT_DIR, QuickCalibration, quick_calibrate, stored_profile
from experiments.deploy_finetune import Finetuning, check_finetune, finetune_in_refit
from experiments.evaluate import build_specs, make_env, record_run

log = logging.getLogger(__name__)

#: What ``arbitrator_kwargs`` may set (:class:`dynamix_gym.service.client.ArbitratorClient`).
ARBITRATOR_KWARGS = (
    "token_file", "job_id", "task", "bundle", "timeout_s", "backoff_s", "max_backoff_s", "ca_file",
    "allow_without_policy", "obs_schema",
)  # fmt: skip


class ResumableController(BaseController):
    """Wraps a controller so that its state is checkpointed with the run and restored on resume; of
    the hooks it forwards :meth:`episode_summary` and :meth:`initial_batches` (a fine-tuned bundle's
    opening; not on a resumed run, which continues at its checkpoint's batches); the others keep
    their defaults."""

    def __init__(self, inner: Any, backend: DDPBackend) -> None:
        self.inner = inner
        self.backend = backend
        self.name = inner.name
        self.action_mode = inner.action_mode
        self.uses_truth = inner.uses_truth
        backend.extra_state["controller"] = lambda: self.inner

    def reset(self, spec, rng: np.random.Generator | None = None) -> None:
        self.inner.reset(spec, rng)
        restored = self.backend.restored_extra.get("controller")
        if restored is not None:
            self.inner = restored
            log.info("controller %s restored from the checkpoint", self.name)

    def predict(self, observation, info, deterministic: bool = True):
        return self.inner.predict(observation, info, deterministic)

    def initial_batches(self, spec) -> np.ndarray | None:
        if self.backend.resuming:
            return None
        return hooks(self.inner).initial_batches(spec)

    @property
    def last_without_policy(self) -> bool:
        return decided_without_policy(self.inner)

    def episode_summary(self) -> dict[str, Any]:
        return hooks(self.inner).episode_summary()


def build_controller(cfg: DictConfig) -> Any:
    """The arbitrator's client, ``policy`` (a registry name or bundle path) or the ``controller`` config."""
    if cfg.get("arbitrator"):  # the arbitrator service decides (token: $DYNAMIX_ARBITRATOR_TOKEN or a file)
        from dynamix_gym.service.client import RemoteController

        kwargs = plain(cfg.get("arbitrator_kwargs")) or {}
        unknown = sorted(set(kwargs) - set(ARBITRATOR_KWARGS))
        if unknown:
            raise ValueError(
                f"arbitrator_kwargs {unknown} unknown; the client takes {list(ARBITRATOR_KWARGS)}"
            )
        return RemoteController(str(cfg.arbitrator), interval=int(cfg.env.interval), **kwargs)
    if cfg.get("policy"):
        return make_controller(str(cfg.policy), **(plain(cfg.get("policy_kwargs")) or {}))
    if cfg.get("controller") is None:
        raise ValueError(
            "give controller=<name> (conf/controller/<name>.yaml) or policy=<name or bundle path>"
        )
    return instantiate(cfg.controller)


def check_compute_curve(controller: Any, quick: bool, backend: Any) -> None:
    """Before any rank starts: a bundle of observation schema 4 reads the ranks' compute curve, which
    the quick calibration measures (not on a resumed run) or ``backend.compute_profile`` gives."""
    if str(env_options(controller).get("obs_schema")) != SCHEMA_VERSION_V4 or backend.get("compute_profile"):
        return
    if quick and not backend.get("resume"):
        return
    hint = (
        "a resumed run is not calibrated again: give backend.compute_profile=<the first run's dir>/profile_refit"
        if quick
        else "set calibrate.quick=true or backend.compute_profile=<a calibrated profile>"
    )
    raise ValueError(f"{MISSING_CURVE} ({hint})")


def deploy(cfg: DictConfig, out_dir: str | Path | None = None) -> float:
    out = Path(out_dir or cfg.get("out_dir") or HydraConfig.get().runtime.output_dir)
    calibration = QuickCalibration.from_config(cfg.get("calibrate"))
    finetune = cfg.get("finetune", False)
    if not isinstance(finetune, bool):
        raise ValueError(f"finetune must be true or false, got {finetune!r}")
    finetuning = Finetuning.from_config(cfg.get("finetuning"))
    controller = build_controller(cfg)
    if finetune:  # before any rank starts: what it needs
        check_finetune(controller, calibration.quick)
    check_compute_curve(controller, calibration.quick, cfg.get("backend") or {})
    stored = stored_profile(calibration, controller) if calibration.quick else None
    specs = build_specs(cfg)
    env = make_env(cfg, controller.action_mode, specs, **env_options(controller))
    backend = env.unwrapped.backend
    if not isinstance(backend, DDPBackend):
        raise ValueError(
            f"experiments.deploy drives the real backend (backend=real), got {type(backend).__name__}"
        )
    try:
        record = None
        if stored is not None:  # on the ranks the episode then trains with, from a fresh start
            record = quick_calibrate(
                backend, stored, calibration, out, int(cfg.seed), interval=int(cfg.env.interval)
            )
        if finetune and record is not None:  # (a resumed run keeps the policy it started with)
            refit = out / REFIT_DIR
            first = np.unique(backend.spec.initial_batch)  # the job's own opening, one batch on every rank
            if len(first) > 1 and finetuning.opening == "refit":
                log.warning(
                    "the ranks start at different batches %s: the job's opening is kept", first.tolist()
                )
            controller, _ = finetune_in_refit(
                controller,
                refit,
                specs["scenario"],
                int(cfg.env.interval),
                finetuning,
                out,
                int(cfg.seed),
                job_batch=int(first[0]) if len(first) == 1 else None,
                ladder=tuple(calibration.batches),
            )
        wrapped = ResumableController(controller, backend)
        result = run_episode(env, wrapped, int(cfg.seed), scenario=specs["scenario"].name)
        spec = backend.spec
        interval = int(env.unwrapped.interval)
        offset = backend.resumed_interval or 0
    finally:
        if hasattr(controller, "client"):  # an arbitrator: tell it how the job ended
            controller.close(final_report=getattr(env.unwrapped, "last_report", None))
        env.close()
    summary, tta = record_run(out, result, wrapped.inner, specs, spec, interval, step_offset=offset)
    guard = backend.guard  # what the guards did (sim.guards): counts and every firing
    atomic_write_text(
        out / "guards.json",
        json.dumps(
            {
                **guard.summary(),
                "config": asdict(guard.config),
                "events": [e.as_dict() for e in guard.events],
            },
            indent=2,
        ),
    )
    blind = int(summary["decisions_without_policy"])
    log.log(
        logging.WARNING if blind else logging.INFO,
        "%s on real DDP (%s, %s): final accuracy %.4f after %.1f s, %d decisions (%d made without the "
        "policy), target %s",
        summary["controller"],
        summary["workload"],
        summary["gpu_types"],
        summary["final_accuracy"],
        summary["total_time_s"],
        summary["decisions"],
        blind,
        "reached" if math.isfinite(tta) else "not reached",
    )
    log.info(
        "guards (%s): %d firings, %d rollbacks, %.1f s lost, %d intervals decided by the fallback (%s)",
        guard.config.mode,
        len(guard.events),
        guard.rollbacks,
        summary["guard_time_lost_s"],
        guard.fallback_intervals,
        out / "guards.json",
    )
    return tta


@hydra.main(version_base=None, config_path="../conf", config_name="deploy")
def main(cfg: DictConfig) -> float:
    return deploy(cfg)


if __name__ == "__main__":
    main()
