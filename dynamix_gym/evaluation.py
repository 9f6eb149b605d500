"""Running one controller for one episode on any backend, and summarising what happened."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynamix_gym.controllers.base import Controller, decided_without_policy, hooks, start_options
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from sim.protocol import IntervalReport

#: Columns every summary row carries (``summary.csv``), in this order.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "controller",
    "scenario",
    "seed",
    "time_to_accuracy_s",
    "final_accuracy",
    "reached_target",
    "total_time_s",
    "mean_idle_fraction",
    "resource_inefficiency",
    "batch_changes",
    "decision_time_ms",
    "decisions",
    "workers",
    "workload",
    "backend",
    "decisions_without_policy",
)


def controller_label(controller: Any) -> str:
    """The controller's ``name``; a static controller's carries its batch (``static-128``) so that
    static runs at different batches stay apart in summaries."""
    name = str(controller.name)
    batch = getattr(controller, "batch", None)
    if name == "static" and isinstance(batch, int | float) and not isinstance(batch, bool):
        return f"static-{int(batch)}"
    return name


@dataclass
class EpisodeResult:
    timeline: list[dict[str, Any]]  # one row per interval (tidy: per-worker values as w{i}_... columns)
    summary: dict[str, Any]


def timeline_row(
    step: int,
    report: IntervalReport,
    reward: float,
    terms: dict[str, float],
    guard: dict[str, Any] | None = None,
    without_policy: bool = False,
) -> dict[str, Any]:
    """One timeline row; ``guard`` (a guarded backend's running counts, ``info["guard"]``) adds the
    guards' columns and the interval's events; ``without_policy``: the batches it ran were kept
    because the controller's (remote) policy did not decide them."""
    row: dict[str, Any] = {
        "step": step,
        "wall_time_s": report.wall_time_s,
        "interval_time_s": report.interval_time_s,
        "val_accuracy": report.val_accuracy,
        "val_loss": report.val_loss,
        "global_batch": report.global_batch,
        "comm_time_s": report.comm_time_s,
        "reward": reward,
        "without_policy": bool(without_policy),
    }
    row.update({f"reward_{k}": v for k, v in terms.items()})
    for i in range(report.num_workers):
        row[f"w{i}_batch"] = int(report.local_batch[i])
        row[f"w{i}_iteration_time_s"] = float(report.iteration_time_s[i])
        row[f"w{i}_compute_time_s"] = float(report.compute_time_s[i])
        row[f"w{i}_idle_time_s"] = float(report.idle_time_s[i])
        row[f"w{i}_batch_accuracy"] = float(report.batch_accuracy[i])
        # the interval's gradient-norm statistics, the inputs of the policies' gradient features (a
        # real campaign's record of them is what the simulator's gradient model can be fitted to)
        row[f"w{i}_grad_norm_mean"] = float(report.grad_norm_mean[i])
        row[f"w{i}_grad_norm_var"] = float(report.grad_norm_var[i])
    if guard is not None:
        row.update({k: v for k, v in guard.items() if k != "guard_mode"})
        row["events"] = "; ".join(report.events)
    if report.truth is not None:
        row["true_val_accuracy"] = report.truth["val_accuracy"]
        row["true_noise_scale"] = report.truth["noise_scale"]
    return row


def run_episode(
    env: HeteroClusterEnv,
    controller: Controller,
    seed: int,
    *,
    scenario: str = "",
    max_steps: int | None = None,
) -> EpisodeResult:
    """Drive ``env`` with ``controller`` from ``reset(seed)`` until the episode ends.

    The controller must emit actions in the env's action mode. Its decision time (the time
    ``predict`` takes) is measured and reported: that is its overhead on a real cluster. A decision
    the controller made without its policy (:func:`~dynamix_gym.controllers.base.decided_without_policy`:
    a remote policy that refused or did not answer) flags its interval's timeline row
    (``without_policy``) and is counted in the summary's ``decisions_without_policy``.
    """
    base = env.unwrapped
    if controller.action_mode != base.action_mode:
        raise ValueError(
            f"controller {controller.name!r} emits {controller.action_mode!r} actions but the env is in "
            f"{base.action_mode!r} mode"
        )
    own = hooks(controller)
    own.check_env(base)  # e.g. a PPO bundle refusing an env with another action set
    own.prepare(env, seed)  # e.g. the hindsight limit, which searches replays of this very episode
    obs, info = env.reset(seed=seed, options=start_options(controller, base.backend.spec))
    controller.reset(base.backend.spec, np.random.default_rng(seed))
    spec = base.backend.spec
    report: IntervalReport = info["report"]
    timeline = [timeline_row(0, report, 0.0, {}, info.get("guard"))]
    idle_gpu_s = float((report.idle_time_s * report.iterations).sum())
    busy_gpu_s = float((report.iteration_time_s * report.iterations).sum())
    idle_fracs = [_idle_fraction(report)]
    decision_s = 0.0
    changes = 0
    without_policy = 0
    step = 0
    terminated = truncated = False
    while not (terminated or truncated):
        t0 = time.perf_counter()
        action, _ = controller.predict(obs, info, deterministic=True)
        decision_s += time.perf_counter() - t0
        blind = decided_without_policy(controller)
        without_policy += int(blind)
        prev = base.batches.copy()
        obs, reward, terminated, truncated, info = env.step(action)
        step += 1
        report = info["report"]
        changes += int(np.any(info["local_batches"] != prev))
        timeline.append(timeline_row(step, report, reward, info["reward_terms"], info.get("guard"), blind))
        idle_gpu_s += float((report.idle_time_s * report.iterations).sum())
        busy_gpu_s += float((report.iteration_time_s * report.iterations).sum())
        idle_fracs.append(_idle_fraction(report))
        if max_steps is not None and step >= max_steps:
            break
    reached = bool(terminated)
    summary = {
        "controller": controller.name,
        "scenario": scenario,
        "seed": seed,
        "time_to_accuracy_s": report.wall_time_s if reached else float("nan"),
        "final_accuracy": report.val_accuracy,
        "reached_target": reached,
        "total_time_s": report.wall_time_s,
        "mean_idle_fraction": float(np.mean(idle_fracs)),
        "resource_inefficiency": idle_gpu_s / busy_gpu_s if busy_gpu_s > 0 else 0.0,
        "batch_changes": changes,
        "decision_time_ms": 1e3 * decision_s / max(step, 1),
        "decisions": step,
        "workers": spec.num_workers,
        "workload": spec.workload,
        "backend": "sim" if report.truth is not None else "real",
        "decisions_without_policy": without_policy,
    }
    if info.get("guard") is not None:  # a guarded backend: what its guards did (sim.guards)
        summary.update(info["guard"])
    summary.update(own.episode_summary())  # e.g. a bundle's inputs out of its training range
    return EpisodeResult(timeline, summary)


def _idle_fraction(report: IntervalReport) -> float:
    live = report.alive
    if not live.any():
        return 0.0
    return float(np.mean(report.idle_time_s[live] / np.maximum(report.iteration_time_s[live], 1e-12)))
