"""Partition planners: PipeDream's dynamic programme and DynPipe's choice of the stage count.

A :class:`StageProfile` is what profiling the quiet cluster at the start gives: for every stage's
worker group, the forward and backward seconds of every block on it (prefix sums) and the seconds
to send each block's output to the next group. The cost of stage s holding blocks [i, j):

    c(s, i, j) = (F_s[j] - F_s[i] + B_s[j] - B_s[i]) * slow_s + X_s(j) + X_s(i)

    X_s(j) = the send of block j - 1's output from s to s + 1 (j < n), X_s(i) the gradient back
    to s - 1 (i > 0); slow_s: a slow-down factor of the group (1 when quiet)

PipeDream's planner (SOSP 2019) chooses the boundaries minimising the slowest stage,

    P(s, j) = min_{i < j} max(P(s - 1, i), c(s, i, j)),   P(0, j) = c(0, 0, j)

over the partitions whose every stage fits its memory cap. DynPipe plans for end-to-end time:
per stage count S (dividing the workers) the planned partition's iteration time T(S) (the
schedule's makespan at the profile) per sample, times the iterations the schedule's staleness
costs W(S) (:func:`sim.pipeline.staleness.staleness_penalty` under async 1F1B, else 1); the S of
the smallest product.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.pipeline.partition import bounds, stage_memory_bytes
from sim.pipeline.schedule import in_flight
from sim.pipeline.simulator import PipelineSimulator


@dataclass(frozen=True)
class StageProfile:
    fwd_cum: np.ndarray  # (S, n + 1) prefix sums of block forward seconds on each stage's group
    bwd_cum: np.ndarray  # (S, n + 1)
    send_next: np.ndarray  # (S, n + 1): block j - 1's output from s to s + 1 (0 at j = 0, n; last stage)
    send_prev: np.ndarray  # (S, n + 1): block j - 1's output gradient from s back to s - 1 (0 for s = 0)
    state_cum: np.ndarray  # (n + 1,) prefix sums of parameter + optimiser bytes
    act_cum: np.ndarray  # (n + 1,) prefix sums of stashed activation bytes per sample
    cap_bytes: np.ndarray  # (S,)
    replicas: tuple[int, ...]
    micro_batch: int
    schedule: str

    @property
    def num_stages(self) -> int:
        return self.fwd_cum.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.fwd_cum.shape[1] - 1


def profile(sim: PipelineSimulator) -> StageProfile:
    """The quiet cluster's per-block times on each stage's workers (no faults, full groups)."""
    m, n, S = sim.model, sim.model.num_blocks, sim.num_stages
    fwd, bwd = np.zeros((S, n + 1)), np.zeros((S, n + 1))
    nxt, prv = np.zeros((S, n + 1)), np.zeros((S, n + 1))
    for s, workers in enumerate(sim.stage_workers):
        share = m.micro_batch / len(workers)
        for j in range(1, n + 1):
            times = [m.stage_compute_s(sim.gpu_types[w], 0, j, share) for w in workers]
            fwd[s, j] = max(t[0] for t in times)
            bwd[s, j] = max(t[1] for t in times)
        for j in range(1, n):
            nbytes = m.output_bytes(j - 1) * share
            if s < S - 1:
                nxt[s, j] = sim.p2p_s(nbytes, workers[0], sim.stage_workers[s + 1][0], 1.0)
            if s > 0:
                prv[s, j] = sim.p2p_s(nbytes, workers[0], sim.stage_workers[s - 1][0], 1.0)
    state = np.array([m.state_bytes(0, j) for j in range(n + 1)])
    act = np.array([m.activation_bytes(0, j) for j in range(n + 1)])
    return StageProfile(
        fwd, bwd, nxt, prv, state, act, sim.stage_cap_bytes.copy(), tuple(len(w) for w in sim.stage_workers),
        m.micro_batch, sim.schedule,
    )  # fmt: skip


def stage_cost(p: StageProfile, s: int, lo: np.ndarray, hi: int, slow: float = 1.0) -> np.ndarray:
    """c(s, lo, hi) for an array of ``lo``."""
    n = p.num_blocks
    comp = (p.fwd_cum[s, hi] - p.fwd_cum[s, lo] + p.bwd_cum[s, hi] - p.bwd_cum[s, lo]) * slow
    out_send = p.send_next[s, hi] if hi < n else 0.0
    return comp + out_send + p.send_prev[s, lo]


def _fits(p: StageProfile, s: int, lo: np.ndarray, hi: int, micro_batches: int) -> np.ndarray:
    flight = in_flight(p.schedule, s, p.num_stages, micro_batches)
    versions = flight if p.schedule == "async_1f1b" else 1
    need = versions * (p.state_cum[hi] - p.state_cum[lo]) + flight * (p.act_cum[hi] - p.act_cum[lo]) * (
        p.micro_batch / p.replicas[s]
    )
    return need <= p.cap_bytes[s]


def pipedream_partition(
    p: StageProfile, micro_batches: int, slowdown: Sequence[float] | None = None
) -> tuple[int, ...]:
    """PipeDream's DP: the partition minimising the slowest stage (memory caps respected)."""
    S, n = p.num_stages, p.num_blocks
    slow = np.ones(S) if slowdown is None else np.asarray(slowdown, dtype=np.float64)
    best = np.full((S, n + 1), math.inf)
    arg = np.zeros((S, n + 1), dtype=int)
    for j in range(1, n - S + 2):
        ok = _fits(p, 0, np.array([0]), j, micro_batches)[0]
        best[0, j] = stage_cost(p, 0, np.array([0]), j, slow[0])[0] if ok else math.inf
    for s in range(1, S):
        for j in range(s + 1, n - (S - s - 1) + 1):
            lo = np.arange(s, j)
            c = np.where(_fits(p, s, lo, j, micro_batches), stage_cost(p, s, lo, j, slow[s]), math.inf)
            v = np.maximum(best[s - 1, lo], c)
            k = int(np.argmin(v))
            best[s, j], arg[s, j] = v[k], lo[k]
    if not math.isfinite(best[S - 1, n]):
        raise ValueError(
            f"no partition of {n} blocks over {S} stages fits the memory caps at {micro_batches} micro-batches"
        )
    cuts = [n]
    for s in range(S - 1, 0, -1):
        cuts.append(int(arg[s, cuts[-1]]))
    cuts.append(0)
    return tuple(int(x) for x in np.diff(cuts[::-1]))


def plan_cost_s(p: StageProfile, sizes: Sequence[int], slowdown: Sequence[float] | None = None) -> float:
    """The slowest stage's cost of a partition (PipeDream's objective)."""
    b = bounds(sizes)
    slow = np.ones(p.num_stages) if slowdown is None else np.asarray(slowdown, dtype=np.float64)
    return max(
        float(stage_cost(p, s, np.array([b[s]]), int(b[s + 1]), float(slow[s]))[0])
        for s in range(p.num_stages)
    )


def dynpipe_plan(
    make_sim, num_workers: int, num_blocks: int, micro_batches: int, max_stages: int
) -> tuple[int, tuple[int, ...], dict[int, float]]:
    """DynPipe's start: per feasible S (dividing the workers, <= max_stages and blocks) the DP
    partition, scored T(S) x W(S) = iteration time per sample x staleness penalty; the best S.

    ``make_sim(S)`` returns a (not reset) simulator of the episode's world with S stages.
    """
    scores: dict[int, float] = {}
    plans: dict[int, tuple[int, ...]] = {}
    for S in range(1, min(num_workers, max_stages, num_blocks) + 1):
        if num_workers % S:
            continue
        sim = make_sim(S)
        try:
            sizes = pipedream_partition(profile(sim), micro_batches)
        except ValueError:
            continue
        quiet = dict(slowdown=np.ones(num_workers), alive=np.ones(num_workers, bool), bandwidth_factor=1.0)
        t = sim.expected_iteration_time_s(sizes, micro_batches, **quiet)
        scores[S] = t / (micro_batches * sim.model.micro_batch) * sim.phi
        plans[S] = sizes
    if not scores:
        raise ValueError("no stage count has a partition that fits the memory caps")
    best = min(scores, key=scores.__getitem__)
    return best, plans[best], scores


def memory_ok(sim: PipelineSimulator, sizes: Sequence[int], micro_batches: int) -> bool:
    reps = [len(w) for w in sim.stage_workers]
    mem = stage_memory_bytes(sim.model, sizes, sim.schedule, micro_batches, reps)
    return bool(np.all(mem <= sim.stage_cap_bytes))
