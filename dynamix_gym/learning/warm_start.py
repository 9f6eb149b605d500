"""The behaviour-cloning warm start of a fresh PPO policy (``TrainConfig.expert_pretrain``): the
expert's rollouts (cached by what they depend on), cloning, DAgger rounds, and VecNormalize's
statistics seeded with the expert's data so PPO starts where cloning left off."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from dynamix_gym.learning.config import TrainConfig

log = logging.getLogger(__name__)


def train_env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The training worlds' env keywords: ``cfg.env`` plus the per-world time scale when set
    (validation envs take ``cfg.env`` alone)."""
    return {**cfg.env, **({"time_scale": cfg.time_scale} if cfg.time_scale != "fixed" else {})}


#: Bump when the simulator or the expert changes what a rollout records: cached rollouts of an
#: older version are then never read.
EXPERT_CACHE_VERSION = 2  # 2: the oracle counts the expected cost of a collapse


def expert_cache_path(cache_dir: str | None, collect: dict[str, Any]) -> Path | None:
    """Where the expert's own rollouts (not DAgger's, which depend on the learner) are cached:
    ``<cache_dir>/expert-<hash of everything they depend on>.npz``; None without a cache dir."""
    if not cache_dir:
        return None
    # TrainConfig holds plain containers (the app converts its config): JSON of them is the key
    key = json.dumps({"version": EXPERT_CACHE_VERSION, **collect}, sort_keys=True, default=str)
    return Path(cache_dir) / f"expert-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


def warm_start(
    cfg: TrainConfig,
    model: PPO,
    venv: VecEnv,
    keep_obs_stats: bool = False,
    deadline: float | None = None,
) -> tuple[dict[str, Any], Any]:
    """Behaviour cloning from an expert (dynamix_gym.learning.imitation); also seeds VecNormalize's
    observation and return statistics with the expert's data so PPO starts where BC left off.
    ``keep_obs_stats``: the observation statistics ``venv`` has are kept (a fine-tuned bundle's: its
    weights read inputs normalised by them) and only the return statistics are seeded. ``deadline``
    (a ``time.perf_counter()`` value): no DAgger round starts after it (the stats say how many ran).
    Returns the statistics and the data cloned (expert and DAgger rows: the cloning term's)."""
    from dynamix_gym.learning.imitation import ExpertData, collect_expert_data, pretrain

    opts = cfg.expert_pretrain
    if opts is None:
        raise ValueError("warm_start needs expert_pretrain")
    expert = {
        "expert": str(opts.expert),
        "expert_kwargs": dict(opts.expert_kwargs or {}),
    }
    t0 = time.perf_counter()
    gamma = float(cfg.ppo.get("gamma", 0.99))
    per_episode = bool(opts.episode_weighting)
    collect = dict(
        domain=cfg.domain,
        env_kwargs=train_env_kwargs(cfg),
        sizes=list(cfg.cluster_sizes),
        episodes=int(opts.episodes),
        gamma=gamma,
        seed=cfg.seed + 7919,
        **expert,
        action_mode=cfg.action_mode,
    )
    cache = expert_cache_path(opts.cache_dir, collect)
    if cache is not None and cache.is_file():
        data = ExpertData.load(cache)
        log.info("expert rollouts from the cache %s (%d samples)", cache, len(data.actions))
    else:
        data = collect_expert_data(**collect)
        if cache is not None:
            data.save(cache)
    scale = 1.0
    obs_fn = lambda x: x  # noqa: E731
    if isinstance(venv, VecNormalize):
        if venv.norm_obs and not keep_obs_stats:
            if opts.obs_stats_weighting == "episode":  # every episode alike (a short run counts)
                w = data.weights(per_episode=True)
                mean = np.average(data.obs, axis=0, weights=w)
                var = np.average((data.obs - mean) ** 2, axis=0, weights=w)
            else:
                mean, var = data.obs.mean(axis=0), data.obs.var(axis=0)
            venv.obs_rms.mean = mean.astype(np.float64)
            venv.obs_rms.var = var.astype(np.float64)
            venv.obs_rms.count = float(len(data.obs))
        if venv.norm_obs:
            obs_fn = venv.normalize_obs
        if venv.norm_reward:
            venv.ret_rms.var = np.asarray(float(np.var(data.returns)))
            venv.ret_rms.count = float(len(data.returns))
            scale = float(np.sqrt(venv.ret_rms.var + venv.epsilon))
    expert_tta = data.mean_tta_s
    epochs = int(opts.epochs)
    lr = float(opts.learning_rate)
    stats = pretrain(
        model, data, obs_fn, scale, epochs=epochs, learning_rate=lr, seed=cfg.seed, per_episode=per_episode
    )
    rounds = []
    stopped = False
    for k in range(int(opts.dagger_rounds)):
        if deadline is not None and time.perf_counter() >= deadline:
            stopped = True
            log.info("warm start: time is up after %d of %d DAgger rounds", k, int(opts.dagger_rounds))
            break
        # DAgger: the learner acts, the expert labels; retrain on everything gathered so far.
        new = collect_expert_data(
            cfg.domain,
            train_env_kwargs(cfg),
            list(cfg.cluster_sizes),
            episodes=opts.episodes_per_dagger_round,
            gamma=gamma,
            seed=cfg.seed + 104729 * (k + 1),
            **expert,
            policy=model,
            obs_fn=obs_fn,
            action_mode=cfg.action_mode,
        )
        data = data + new
        stats = pretrain(
            model,
            data,
            obs_fn,
            scale,
            epochs=max(epochs // 2, 1),
            learning_rate=lr / 2,
            seed=cfg.seed + k + 1,
            per_episode=per_episode,
        )
        rounds.append({"learner_mean_tta_s": new.mean_tta_s, **stats})
    stats["dagger"] = rounds
    if deadline is not None:
        stats["stopped_by_wall_clock"] = stopped
    stats.update(
        expert=expert["expert"],
        episodes=data.episodes,
        expert_mean_tta_s=expert_tta,
        seconds=time.perf_counter() - t0,
    )
    log.info("warm start from %s: %s", stats["expert"], stats)
    return stats, data
