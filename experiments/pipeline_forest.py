"""Fit DynPipe's stage slowdown predictor (a random forest) on simulated pipeline runs.

    python -m experiments.pipeline_forest                 # conf/pipeline_forest.yaml

Runs worlds of the ``pipeline`` split's train side (seeds >= ``seed_from``, never the test side's)
under the interference-family scenarios, driven by the truth re-planner or by random masked moves
so that the counters cover many partitions. Every interval gives one row per stage: the features
of :mod:`dynamix_gym.pipeline.forest` and the true slowdown. Every ``holdout_every``-th episode is
held out for R^2, mean absolute error and the detection of slowdowns above the threshold.
Writes ``<out_dir>/forest.pkl`` and ``forest.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import TruthReplanController
from dynamix_gym.pipeline.forest import FEATURES, StageFeatures, StagePredictor
from dynamix_gym.pipeline.worlds import SPLITS, world_fn
from experiments.common import REPO_ROOT, hydra_app, plain

log = logging.getLogger(__name__)


def episode_rows(env: PipelineClusterEnv, seed: int, random_moves: bool, max_steps: int):
    ctrl = TruthReplanController(0.1)
    obs, info = env.reset(seed=seed, options=ctrl.start_options(env, seed))
    ctrl.reset(env)
    feats = StageFeatures(env.quiet_profile())
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(max_steps):
        r = info["report"]
        xs.append(feats.update(r))
        ys.append(np.asarray(r.truth["stage_slowdown"]))
        if random_moves:
            m = env.action_mask_matrix()
            a = [rng.choice(np.flatnonzero(m[i, :3])) for i in range(env.max_stages - 1)]
            a.append(env.micro_batch_set.index(env.micro_batches))
        else:
            a, _ = ctrl.predict(obs, info)
        obs, _, term, trunc, info = env.step(a)
        if term or trunc:
            break
    return np.concatenate(xs), np.concatenate(ys)


def fit(cfg: DictConfig) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestRegressor

    if cfg.split != "train":
        raise ValueError(f"split must be 'train' (the test worlds are never fitted on), got {cfg.split!r}")
    t0 = time.perf_counter()
    episodes = []
    k = 0
    for scenario in cfg.scenarios:
        env = PipelineClusterEnv(world=world_fn("train", scenario), interval=200)
        for i in range(int(cfg.episodes_per_scenario)):
            seed = SPLITS["train"].seed_offset + int(cfg.seed_from) + k
            k += 1
            random_moves = (i / max(int(cfg.episodes_per_scenario), 1)) < float(cfg.random_action_share)
            x, y = episode_rows(env, seed, random_moves, int(cfg.max_steps))
            episodes.append({"x": x, "y": y, "holdout": k % int(cfg.holdout_every) == 0})
    train = [e for e in episodes if not e["holdout"]]
    hold = [e for e in episodes if e["holdout"]]
    xt, yt = np.concatenate([e["x"] for e in train]), np.concatenate([e["y"] for e in train])
    xh, yh = np.concatenate([e["x"] for e in hold]), np.concatenate([e["y"] for e in hold])
    model = RandomForestRegressor(**OmegaConf.to_container(cfg.forest), random_state=0, n_jobs=1)
    model.fit(xt, yt)
    pred = np.maximum(model.predict(xh), 1.0)
    ss = float(((yh - yh.mean()) ** 2).sum())
    thr = float(cfg.threshold)
    truly, said = yh > thr, pred > thr
    meta = {
        "features": list(FEATURES),
        "rows_train": len(yt),
        "rows_holdout": len(yh),
        "episodes": len(episodes),
        "holdout_r2": 1.0 - float(((yh - pred) ** 2).sum()) / ss if ss > 0 else float("nan"),
        "holdout_mae": float(np.abs(yh - pred).mean()),
        "detection_recall": float((said & truly).sum() / max(truly.sum(), 1)),
        "detection_precision": float((said & truly).sum() / max(said.sum(), 1)),
        "threshold": thr,
        "config": plain(cfg),
        "fit_seconds": time.perf_counter() - t0,
    }
    out = Path(cfg.out_dir)
    out = out if out.is_absolute() else REPO_ROOT / out
    StagePredictor(model, meta).save(out)
    log.info("stage forest: holdout R^2 %.3f, MAE %.3f, recall %.2f, precision %.2f -> %s",
             meta["holdout_r2"], meta["holdout_mae"], meta["detection_recall"], meta["detection_precision"], out)  # fmt: skip
    return meta


main = hydra_app("pipeline_forest", fit, "holdout_r2", __spec__)


if __name__ == "__main__":
    main()
