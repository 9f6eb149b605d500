"""Observation gap between real training and its calibrated simulator, feature by feature.

    python -m experiments.obs_gap

A policy pretrained in simulation acts on the observation the env encodes from each interval
report. Where a feature means something else on the real backend (a counter the profile does not
calibrate, a convergence curve that is off early in training), the policy meets inputs it never saw
in training. This app plays the same controller, scenario and seeds on the real DDP backend and in
the simulator calibrated from it, and ranks the features by their mean absolute difference per
interval (normalised units: every feature lives in [-1, 1]). Writes a markdown table (the command
at its top).
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from adapters.sim2real import (
    RealEnvs,
    build_scenario,
    controller_specs,
    real_profile,
    sim_env,
    spec_controller,
)
from dynamix_gym.controllers.base import Controller, env_options
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.obs import split_centralised
from experiments.common import atomic_write_text
from experiments.reports.markdown import render, table

log = logging.getLogger(__name__)
COMMAND = "python -m experiments.obs_gap"


def rollout(env: HeteroClusterEnv, ctl: Controller, steps: int, seed: int) -> np.ndarray:
    """(intervals, workers, features) per-worker observation rows of one episode."""
    obs, info = env.reset(seed=seed)
    n = env.unwrapped.num_workers
    ctl.reset(env.unwrapped.backend.spec, np.random.default_rng(seed))
    schema = env.unwrapped.obs_schema
    rows = [split_centralised(obs, n, schema)]
    for _ in range(steps):
        action, _ = ctl.predict(obs, info, deterministic=True)
        obs, _, terminated, truncated, info = env.step(action)
        rows.append(split_centralised(obs, n, schema))
        if terminated or truncated:
            break
    return np.array(rows)


def run(cfg: DictConfig) -> list[dict]:
    profile, real_config = real_profile(str(cfg.profile))
    fid = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / f"{cfg.fidelity}.yaml")
    scenario = build_scenario(fid.scenario, profile)
    (spec,) = controller_specs([cfg.probe], int(cfg.initial_batch), None)
    probe = spec_controller(spec)
    # a bundle's own observation schema and action set on both backends; a schema-4 bundle's ranks
    # carry the profile's compute curve, as a deployment campaign's do
    mode, options = probe.action_mode, env_options(probe)
    if cfg.get("obs_schema") is not None:  # a rule-based probe read through a policy's schema
        options = {**options, "obs_schema": int(cfg.obs_schema)}
    k, budget, steps = int(cfg.interval), float(cfg.time_budget_s), int(cfg.steps)
    real = RealEnvs(real_config, scenario, budget, compute_profile=str(profile.path))
    try:
        renv = real.env(spec["initial_batch"], mode, k, "time", options)
        names = renv.unwrapped.obs_schema.per_worker_names()
        real_rows = [rollout(renv, spec_controller(spec), steps, int(s)) for s in cfg.seeds]
    finally:
        real.close()
    sim_rows = [
        rollout(
            sim_env(profile, scenario, spec["initial_batch"], mode, k, "time", budget, options),
            spec_controller(spec),
            steps,
            int(s),
        )
        for s in cfg.seeds
    ]
    rows, real_all = feature_gaps(real_rows, sim_rows, names)
    setting = (
        f"Profile `{cfg.profile}`, scenario `{scenario.name}` ({scenario.description}), controller {spec['label']} "
        f"(observation schema {renv.unwrapped.obs_schema.version}), K = {k}, seeds {list(cfg.seeds)}, "
        f"{len(real_all)} intervals x {real_all.shape[1]} workers compared."
    )
    text = render_gap(rows[: int(cfg.top)], setting)
    out = Path(to_absolute_path(str(cfg.out)))
    atomic_write_text(out, text)
    print(text, end="")
    print(f"wrote {out}")
    return rows


def feature_gaps(
    real_rows: list[np.ndarray], sim_rows: list[np.ndarray], names: list[str]
) -> tuple[list[dict], np.ndarray]:
    """Features (``names``: the schema's per-worker names) by their mean absolute difference,
    interval by interval over the common length of each seed's two episodes, and at the first
    decision alone (the observation after the warm-up interval, where both backends ran the same
    batches); and the real rows compared."""
    pairs = [
        (r[: min(len(r), len(s))], s[: min(len(r), len(s))]) for r, s in zip(real_rows, sim_rows, strict=True)
    ]
    real_all = np.concatenate([p[0] for p in pairs])
    sim_all = np.concatenate([p[1] for p in pairs])
    gap = np.abs(real_all - sim_all).mean(axis=(0, 1))
    first = np.mean([np.abs(r[0] - s[0]) for r, s in pairs], axis=(0, 1))
    rows = [
        {
            "feature": names[i],
            "real_mean": float(real_all[..., i].mean()),
            "sim_mean": float(sim_all[..., i].mean()),
            "mean_abs_diff": float(gap[i]),
            "first_decision_diff": float(first[i]),
        }
        for i in np.argsort(-gap)
    ]
    return rows, real_all


HEADER = ["feature", "real mean", "sim mean", "mean abs difference", "at the first decision"]


def render_gap(rows: list[dict], setting: str) -> str:
    intro = [
        "# Observation gap: real training vs its calibrated simulator",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        f"{setting} Features are in normalised units (each spans [-1, 1]); the mean absolute difference is "
        "taken interval by interval, worker by worker.",
        "",
    ]
    cells = [
        [
            r["feature"],
            f"{r['real_mean']:+.3f}",
            f"{r['sim_mean']:+.3f}",
            f"{r['mean_abs_diff']:.3f}",
            f"{r['first_decision_diff']:.3f}",
        ]
        for r in rows
    ]
    return render(intro + table(HEADER, cells))


def read_gap(path: Path) -> list[dict]:
    """The feature rows of a written report (:func:`render_gap`), largest difference first (a report
    written before the first-decision column reads NaN there)."""
    rows = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            len(cells) not in (len(HEADER) - 1, len(HEADER))
            or cells[0] == HEADER[0]
            or set(cells[1]) <= {"-"}
        ):
            continue
        rows.append(
            {
                "feature": cells[0],
                "real_mean": float(cells[1]),
                "sim_mean": float(cells[2]),
                "mean_abs_diff": float(cells[3]),
                "first_decision_diff": float(cells[4]) if len(cells) == len(HEADER) else float("nan"),
            }
        )
    return rows


@hydra.main(version_base=None, config_path="../conf", config_name="obs_gap")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
