"""One elastic episode of a controller (a baseline or a learned policy) and its metrics."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from dynamix_gym.elastic.baselines import ElasticController, ElasticSpec
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv


def run_elastic_episode(env: ElasticClusterEnv, controller: Any, seed: int) -> dict[str, Any]:
    """Run one episode; returns time and dollars to accuracy (``inf`` if the target was not
    reached), the final quality, restarts, preemptions and the per-step history."""
    env = env.unwrapped
    obs, info = env.reset(seed=seed)
    if isinstance(controller, ElasticController):
        controller.reset(ElasticSpec.from_env(env), np.random.default_rng(seed))
    elif hasattr(controller, "reset_episode"):
        controller.reset_episode()
    t0 = time.perf_counter()
    decisions = 0
    preemptions = 0
    denied = 0
    while True:
        action, _ = controller.predict(obs, info, deterministic=True)
        obs, _, terminated, truncated, info = env.step(action)
        decisions += 1
        preemptions += sum(" preempt " in e for e in info["pool_events"])
        denied += len(info["denied"])
        if terminated or truncated:
            break
    reached = bool(terminated)
    return {
        "time_to_accuracy_s": info["wall_time_s"] if reached else math.inf,
        "dollars_to_accuracy": info["spend_usd"] if reached else math.inf,
        "reached_target": reached,
        "final_accuracy": float(info["val_accuracy"]),
        "total_time_s": float(info["wall_time_s"]),
        "spend_usd": float(info["spend_usd"]),
        "decisions": decisions,
        "restarts": int(info["restarts"]),
        "preemptions": preemptions,
        "denied_requests": denied,
        "mean_gpus": float(np.mean([h["gpus"] for h in env.history])),
        "decision_time_ms": 1e3 * (time.perf_counter() - t0) / max(decisions, 1),
        "history": list(env.history),
    }
