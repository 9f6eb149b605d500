"""The batched vector env against the per-cluster env, side by side: env steps/s over batch sizes.

    python -m experiments.bench_env            (after the overhead table; batched.enabled=false skips)

Both play the same worlds: cluster ``i`` is ``HeteroClusterEnv(workers=n, scenario=.., interval=K)``
reset with seed ``seed + i``; the policy holds every batch (delta 0) and episodes end at the target
only (no time budget), so both run the same simulated history. An env step is one interval decision
of one cluster on both sides. The per-cluster envs are stepped one after the other in a Python loop
(``per_cluster_envs`` of them, round robin: their cost per step does not depend on how many there
are); :class:`BatchedClusterVectorEnv` steps ``batch`` clusters in one call, with one noise stream for
the batch (``noise="batch"``, the fast path) and with each cluster's own stream (``noise="stream"``,
the per-cluster env's numbers). Measurements alternate in rounds so that machine load hits all
alike; the fastest round of each is kept, by wall clock and by the process's CPU time (on a loaded
machine the second is the steadier). Beside each batch size: the rate of the batch's random draws
alone (one ``BatchNoise.draw`` per step: a normal of compute noise for every worker-iteration, as the
per-cluster engine draws, and two draws per worker for the gradient factors the engine draws per
worker-iteration), which bounds what any arrangement of the arithmetic can reach.
Memory: the peak that ``tracemalloc`` (which traces numpy's buffers) sees while the batched env is
built, reset and stepped, and the growth of the process's resident set (psutil) meanwhile (a lower
bound: the allocator reuses what earlier measurements freed).
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import psutil

from dynamix_gym.envs.batched_vector import BatchedClusterVectorEnv
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv

HOLD = 2  # index of delta 0 in the default action set


def _per_second(fn, seconds: float, units: int) -> tuple[float, float]:
    """Units per second of ``fn`` (which does ``units`` units of work) over about ``seconds``: by
    wall clock and by this process's CPU time."""
    fn()
    count, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            cpu = max(time.process_time() - c0, 1e-9)
            return count * units / elapsed, count * units / cpu


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


def _draws(workers, scenario, iterations, batch, seed):
    """One step's random draws of a batched env of ``batch`` clusters, alone."""
    vec = BatchedClusterVectorEnv(1, noise="batch", **_world(workers, scenario, iterations))
    noise = vec.core.engine.noise
    noise.rng = np.random.Generator(np.random.SFC64(seed))
    idx, nw = np.arange(batch), np.full(batch, workers)
    return lambda: noise.draw(idx, iterations, nw, workers)


def memory_mib(workers, scenario, iterations, batch, seed, steps: int = 3) -> tuple[float, float]:
    """Peak traced memory (MiB) of building, resetting and stepping a batched env of ``batch``, and
    the growth of the resident set over it (MiB)."""
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    tracemalloc.start()
    try:
        step = _batched(workers, scenario, iterations, batch, seed, "batch")
        for _ in range(steps):
            step()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return peak, (proc.memory_info().rss - rss0) / 2**20


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
    """Env steps/s of the per-cluster envs and of the batched env at each batch size (best round),
    by wall clock (``*_steps_per_s``, ``speedup``) and by CPU time (``*_cpu``)."""
    single = _per_cluster(workers, scenario, iterations, per_cluster_envs, seed)
    fast = {b: _batched(workers, scenario, iterations, b, seed, "batch") for b in batch_sizes}
    exact = {b: _batched(workers, scenario, iterations, b, seed, "stream") for b in stream_sizes}
    draws = {b: _draws(workers, scenario, iterations, b, seed) for b in batch_sizes}
    best = {"single": np.zeros(2)}
    for _ in range(rounds):
        best["single"] = np.maximum(best["single"], _per_second(single, seconds, per_cluster_envs))
        for kind, fns in (("fast", fast), ("exact", exact), ("draws", draws)):
            for b, fn in fns.items():
                key = (kind, b)
                best[key] = np.maximum(best.get(key, np.zeros(2)), _per_second(fn, seconds, b))
    single_wall, single_cpu = (float(x) for x in best["single"])
    rows = []
    for b in batch_sizes:
        fast_wall, fast_cpu = (float(x) for x in best[("fast", b)])
        exact_wall = float(best[("exact", b)][0]) if b in exact else None
        draws_cpu = float(best[("draws", b)][1])
        peak, rss = memory_mib(workers, scenario, iterations, b, seed)
        rows.append(
            {
                "batch": b,
                "batched_steps_per_s": fast_wall,
                "speedup": fast_wall / single_wall,
                "batched_steps_per_s_cpu": fast_cpu,
                "speedup_cpu": fast_cpu / single_cpu,
                "stream_steps_per_s": exact_wall,
                "stream_speedup": None if exact_wall is None else exact_wall / single_wall,
                "draws_steps_per_s_cpu": draws_cpu,
                "draws_bound_speedup_cpu": draws_cpu / single_cpu,
                "peak_mib": peak,
                "rss_growth_mib": rss,
            }
        )
    return {
        "workers": workers,
        "per_cluster_steps_per_s": single_wall,
        "per_cluster_steps_per_s_cpu": single_cpu,
        "rows": rows,
    }


def plot(results: list[dict], path, targets: dict[int, float] | None = None) -> None:
    """Env steps/s, speed-up (with the bound of the draws alone and the target) and memory over
    batch sizes, one colour per (workers, scenario)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15.0, 4.6))
    ax_rate, ax_up, ax_mem = fig.subplots(1, 3)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    drawn_targets = set()
    for res, colour in zip(results, colours, strict=False):
        n = f"{res['workers']} w., {res['scenario']}"
        rows = res["rows"]
        sizes = [r["batch"] for r in rows]
        ax_rate.plot(
            sizes, [r["batched_steps_per_s"] for r in rows], "o-", color=colour, label=f"batched, {n}"
        )
        stream = [(r["batch"], r["stream_steps_per_s"]) for r in rows if r["stream_steps_per_s"]]
        if stream:
            ax_rate.plot(*zip(*stream, strict=True), "s:", color=colour, label=f"batched, own streams, {n}")
        ax_rate.axhline(res["per_cluster_steps_per_s"], color=colour, linestyle="--", linewidth=1,
                        label=f"per-cluster env, {n}")  # fmt: skip
        ax_up.plot(sizes, [r["speedup"] for r in rows], "o-", color=colour, label=f"{n} (wall clock)")
        if "speedup_cpu" in rows[0]:
            ax_up.plot(sizes, [r["speedup_cpu"] for r in rows], "x--", color=colour, linewidth=1,
                       label=f"{n} (CPU time)")  # fmt: skip
            ax_up.plot(sizes, [r["draws_bound_speedup_cpu"] for r in rows], "v:", color=colour, linewidth=1,
                       label=f"{n}: bound of the draws alone")  # fmt: skip
        target = (targets or {}).get(res["workers"])
        if target is not None and res["workers"] not in drawn_targets:
            drawn_targets.add(res["workers"])
            ax_up.axhline(target, color="grey", linestyle="-.", linewidth=1)
            ax_up.annotate(f"target {target:g}x ({res['workers']} w.)", (sizes[0], target), fontsize=7,
                           va="bottom", color="grey")  # fmt: skip
        ax_mem.plot(sizes, [r["peak_mib"] for r in rows], "o-", color=colour, label=n)
    ax_mem.axhline(2048, color="grey", linestyle="-.", linewidth=1)
    ax_mem.annotate("limit 2 GiB", (1, 2048), fontsize=7, va="top", color="grey")
    for ax, title, unit in ((ax_rate, "env steps per second (one core)", "steps/s"),
                            (ax_up, "speed-up over the per-cluster env", "x"),
                            (ax_mem, "peak traced memory of the batched env", "MiB")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (clusters)")
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=5.5, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
