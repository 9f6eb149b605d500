"""The batched vector env against the per-cluster env, side by side: env steps/s over batch sizes.

    python -m experiments.bench_env            (after the overhead table; batched.enabled=false skips)

Both play the same worlds: cluster ``i`` is ``HeteroClusterEnv(workers=n, scenario=.., interval=K)``
reset with seed ``seed + i``; the policy holds every batch (delta 0) and episodes end at the target
only (no time budget), so both run the same simulated history. The per-cluster envs are stepped one
after the other in a Python loop (``per_cluster_envs`` of them, round robin: their cost per step does
not depend on how many there are); :class:`BatchedClusterVectorEnv` steps ``batch`` clusters in one
call, with one noise stream for the batch (``noise="batch"``, the fast path) and with each cluster's
own stream (``noise="stream"``, the per-cluster env's numbers). Measurements alternate in rounds so
that machine load hits all alike; the fastest round of each is kept. Memory: the peak that
``tracemalloc`` (which traces numpy's buffers) sees while the batched env is built, reset and stepped.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from dynamix_gym.envs.batched_vector import BatchedClusterVectorEnv
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv

HOLD = 2  # index of delta 0 in the default action set


def _per_second(fn, seconds: float, units: int) -> float:
    """Units per second of ``fn`` (which does ``units`` units of work) over about ``seconds``."""
    fn()
    count, t0 = 0, time.perf_counter()
    while True:
        fn()
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return count * units / elapsed


def _world(workers: int, scenario: str, iterations: int) -> dict:
    return dict(workers=workers, scenario=scenario, interval=iterations, time_budget_s=1e12)


def _per_cluster(workers, scenario, iterations, count, seed):
    envs = [HeteroClusterEnv(**_world(workers, scenario, iterations)) for _ in range(count)]
    for i, e in enumerate(envs):
        e.reset(seed=seed + i)
    hold = np.full(workers, HOLD)

    def step_all():
        for e in envs:
            _, _, terminated, _, _ = e.step(hold)
            if terminated:
                e.reset()

    return step_all


def _batched(workers, scenario, iterations, batch, seed, noise):
    vec = BatchedClusterVectorEnv(batch, noise=noise, **_world(workers, scenario, iterations))
    vec.reset(seed=seed)
    hold = np.full((batch, workers), HOLD)
    return lambda: vec.step(hold)


def peak_memory_mib(workers, scenario, iterations, batch, seed, steps: int = 3) -> float:
    """Peak traced memory (MiB) of building, resetting and stepping a batched env of ``batch``."""
    tracemalloc.start()
    try:
        step = _batched(workers, scenario, iterations, batch, seed, "batch")
        for _ in range(steps):
            step()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def measure(
    workers: int,
    scenario: str,
    iterations: int,
    batch_sizes: list[int],
    seconds: float,
    seed: int,
    rounds: int,
    per_cluster_envs: int,
    stream_sizes: list[int],
) -> dict:
    """Env steps/s of the per-cluster envs and of the batched env at each batch size (best round)."""
    single = _per_cluster(workers, scenario, iterations, per_cluster_envs, seed)
    fast = {b: _batched(workers, scenario, iterations, b, seed, "batch") for b in batch_sizes}
    exact = {b: _batched(workers, scenario, iterations, b, seed, "stream") for b in stream_sizes}
    best_single, best_fast, best_exact = 0.0, dict.fromkeys(fast, 0.0), dict.fromkeys(exact, 0.0)
    for _ in range(rounds):
        best_single = max(best_single, _per_second(single, seconds, per_cluster_envs))
        for b, fn in fast.items():
            best_fast[b] = max(best_fast[b], _per_second(fn, seconds, b))
        for b, fn in exact.items():
            best_exact[b] = max(best_exact[b], _per_second(fn, seconds, b))
    rows = []
    for b in batch_sizes:
        rows.append(
            {
                "batch": b,
                "batched_steps_per_s": best_fast[b],
                "speedup": best_fast[b] / best_single,
                "stream_steps_per_s": best_exact.get(b),
                "stream_speedup": best_exact[b] / best_single if b in best_exact else None,
                "peak_mib": peak_memory_mib(workers, scenario, iterations, b, seed),
            }
        )
    return {"workers": workers, "per_cluster_steps_per_s": best_single, "rows": rows}


def plot(results: list[dict], path) -> None:
    """Env steps/s and speed-up over batch sizes, one line per worker count; memory beside."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13.5, 4.0))
    ax_rate, ax_up, ax_mem = fig.subplots(1, 3)
    for res, colour in zip(
        results, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"), strict=False
    ):
        n = f"{res['workers']} w., {res['scenario']}"
        sizes = [r["batch"] for r in res["rows"]]
        ax_rate.plot(sizes, [r["batched_steps_per_s"] for r in res["rows"]], "o-", color=colour,
                     label=f"batched, {n}")  # fmt: skip
        stream = [(r["batch"], r["stream_steps_per_s"]) for r in res["rows"] if r["stream_steps_per_s"]]
        if stream:
            ax_rate.plot(
                *zip(*stream, strict=True), "s:", color=colour, label=f"batched, own streams, {n} w."
            )
        ax_rate.axhline(res["per_cluster_steps_per_s"], color=colour, linestyle="--", linewidth=1,
                        label=f"per-cluster env, {n}")  # fmt: skip
        ax_up.plot(sizes, [r["speedup"] for r in res["rows"]], "o-", color=colour, label=n)
        ax_mem.plot(sizes, [r["peak_mib"] for r in res["rows"]], "o-", color=colour, label=n)
    for ax, title, unit in ((ax_rate, "env steps per second (one core)", "steps/s"),
                            (ax_up, "speed-up over the per-cluster env", "x"),
                            (ax_mem, "peak memory of the batched env", "MiB")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (clusters)")
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
