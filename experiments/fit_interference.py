"""Fit DynPipe's interference predictor (a random forest) on simulated runs with co-located jobs.

    python -m experiments.fit_interference                 # conf/fit_interference.yaml

Runs the benchmark's *train* split tasks that have slowdowns, and generated scenarios (the
interference preset at several intensities on the train split's clusters), at seeds >= 100, with
controllers that move the batches (random, DLB) so the counters cover many splits. Every interval
gives one row per live worker: the features of :mod:`dynamix_gym.controllers.interference` and the true
slowdown ratio (max(GPU, host) slow-down over the worker's smallest in the run). Whole episodes
are held out (every ``holdout_every``-th) to report R^2, mean absolute error and the detection of
slowdowns above the controller's threshold. Writes ``<out_dir>/forest.pkl``, ``forest.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from dynamix_gym.benchmark import load_suite, split_tasks, task_interval, task_specs
from dynamix_gym.controllers.dlb import DLBController
from dynamix_gym.controllers.interference import (
    FEATURES,
    InterferenceFeatures,
    SlowdownPredictor,
    true_slowdown,
)
from dynamix_gym.controllers.random_controller import RandomController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from experiments.common import REPO_ROOT, hydra_app, plain
from sim.faults import scale_intensity

log = logging.getLogger(__name__)


def episode_rows(
    specs: dict, interval: int, controller, seed: int, max_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    env = HeteroClusterEnv(**specs, action_mode=controller.action_mode, interval=interval)
    _, info = env.reset(seed=seed)
    controller.reset(env.backend.spec, np.random.default_rng(seed))
    feats = InterferenceFeatures(env.backend.spec)
    xs, slows, lives = [], [], []
    done, steps = False, 0
    while True:
        report = info["report"]
        xs.append(feats.update(report))
        slows.append(true_slowdown(report))
        lives.append(report.alive & (report.compute_time_s > 0))
        if done or steps >= max_steps:
            break
        action, _ = controller.predict(None, info, deterministic=True)
        _, _, term, trunc, info = env.step(action)
        done, steps = term or trunc, steps + 1
    env.close()
    slow, live = np.stack(slows), np.stack(lives)
    # the slowdown ratio: each worker's factor over its own smallest in the run (uncontended)
    base = np.where(live, slow, np.inf).min(axis=0)
    ratio = slow / np.where(np.isfinite(base), base, 1.0)
    return np.concatenate([x[m] for x, m in zip(xs, live, strict=True)]), ratio[live]


def collect(cfg: DictConfig) -> list[dict[str, Any]]:
    bench = load_suite(cfg.benchmark)
    split = str(cfg.split)
    if split == "test":
        raise ValueError("split=test: the benchmark's test split is for scoring only")
    tasks, _ = split_tasks(bench, split)
    jobs = []
    for name in cfg.tasks:
        task = tasks[name]
        jobs.append((name, task_specs(task, {"kind": "time"}), task_interval(task)))
    for name in cfg.generated.tasks:  # the interference preset at other intensities
        task = tasks[name]
        for factor in cfg.generated.intensities:
            specs = task_specs({**task, "scenario": "interference"}, {"kind": "time"})
            specs["scenario"] = scale_intensity(specs["scenario"], float(factor))
            jobs.append((f"{name}+interference x{factor}", specs, task_interval(task)))
    episodes = []
    seed = int(cfg.seed_from)
    for name, specs, interval in jobs:
        for k in range(int(cfg.seeds_per_task)):
            ctl = RandomController(hold=3) if k % 2 == 0 else DLBController()
            t0 = time.perf_counter()
            x, y = episode_rows(specs, interval, ctl, seed, int(cfg.max_steps))
            episodes.append({"task": name, "seed": seed, "controller": ctl.name, "x": x, "y": y})
            log.info(
                "%s seed %d (%s): %d rows in %.1f s", name, seed, ctl.name, len(x), time.perf_counter() - t0
            )
            seed += 1
    return episodes


def fit(cfg: DictConfig) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.metrics import mean_absolute_error, r2_score

    if int(cfg.seed_from) < 100:
        raise ValueError(
            f"seed_from must be >= 100 (seeds below are the benchmark's scoring seeds), got {cfg.seed_from}"
        )
    episodes = collect(cfg)
    every = int(cfg.holdout_every)
    train = [e for i, e in enumerate(episodes) if i % every != every - 1]
    held = [e for i, e in enumerate(episodes) if i % every == every - 1]

    def stack(eps):
        return np.concatenate([e["x"] for e in eps]), np.concatenate([e["y"] for e in eps])

    x_tr, y_tr = stack(train)
    x_te, y_te = stack(held)
    forest = RandomForestRegressor(
        n_estimators=int(cfg.forest.n_estimators),
        max_depth=int(cfg.forest.max_depth),
        min_samples_leaf=int(cfg.forest.min_samples_leaf),
        random_state=int(cfg.seed),
        n_jobs=1,
    )
    forest.fit(x_tr, y_tr)
    pred = np.maximum(forest.predict(x_te), 1.0)
    thr = float(cfg.threshold)
    truth_hit, pred_hit = y_te > thr, pred > thr
    tp = int((truth_hit & pred_hit).sum())
    meta = {
        "features": list(FEATURES),
        "target": "max(gpu_slowdown, host_slowdown) / the worker's smallest in the run",
        "train_rows": len(y_tr),
        "holdout_rows": len(y_te),
        "episodes": [{k: e[k] for k in ("task", "seed", "controller")} for e in episodes],
        "holdout_r2": float(r2_score(y_te, pred)),
        "holdout_mae": float(mean_absolute_error(y_te, pred)),
        "threshold": thr,
        "holdout_precision": tp / max(int(pred_hit.sum()), 1),
        "holdout_recall": tp / max(int(truth_hit.sum()), 1),
        "holdout_slowed_share": float(truth_hit.mean()),
        "importances": dict(zip(FEATURES, forest.feature_importances_.round(4).tolist(), strict=True)),
        "config": plain(cfg),
    }
    out = Path(cfg.out_dir)
    SlowdownPredictor(forest, meta).save(out if out.is_absolute() else REPO_ROOT / out)
    log.info(
        "interference forest: R2 %.3f, MAE %.3f, precision %.3f, recall %.3f (held-out %d rows)",
        meta["holdout_r2"],
        meta["holdout_mae"],
        meta["holdout_precision"],
        meta["holdout_recall"],
        len(y_te),
    )
    return meta


main = hydra_app("fit_interference", fit, "holdout_r2", __spec__)


if __name__ == "__main__":
    main()
