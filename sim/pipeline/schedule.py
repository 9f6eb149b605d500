"""Pipeline schedules and the time of one iteration (M micro-batches through S stages).

Stage s spends ``f[s]`` on the forward of one micro-batch and ``b[s]`` on its backward, each
including the blocking send of its output (activations down, gradients up; transfers are not
assumed to overlap with compute). An op starts when the stage's previous op is done and its input
has arrived: F(s, m) after F(s-1, m); B(s, m) after B(s+1, m) (the last stage's backward after its
own forward). The order of a stage's ops is the schedule:

    gpipe       F0 .. F(M-1), then B0 .. B(M-1)                           (synchronous, flush)
    1f1b        w = min(S-s-1, M) warm-up forwards, then F(w+j), B(j) alternating, then the
                remaining backwards                                       (synchronous, flush)
    async_1f1b  1F1B without a flush (PipeDream): the steady state runs one micro-batch per
                max_s (f[s] + b[s]); an iteration of M micro-batches takes M times that, and the
                first iteration after a (re)start pays the 1F1B fill and drain instead.

The makespan of the synchronous schedules is the longest path of that dependency graph
(:func:`iteration_time_s`, exact; GPipe's reduces to sum f + (M-1) max f + sum b + (M-1) max b,
and uniform stages to (M + S - 1)(f + b), a bubble fraction of (S - 1) / (M + S - 1)).
In-flight micro-batches of stage s (activations stashed): M under GPipe, min(S - s, M) under 1F1B;
async 1F1B stashes as many weight versions (weight stashing).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from sim.validation import check_choice, check_int

SCHEDULES = ("gpipe", "1f1b", "async_1f1b")
SYNCHRONOUS = ("gpipe", "1f1b")


def stage_ops(kind: str, stages: int, micro_batches: int) -> list[list[tuple[str, int]]]:
    """The order of each stage's ops: ``[("F", m) | ("B", m), ...]`` per stage."""
    check_choice("schedule", kind, SCHEDULES)
    S = check_int("stages", stages, 1)
    M = check_int("micro_batches", micro_batches, 1)
    out = []
    for s in range(S):
        if kind == "gpipe":
            ops = [("F", m) for m in range(M)] + [("B", m) for m in range(M)]
        else:
            w = min(S - s - 1, M)
            ops = [("F", m) for m in range(w)]
            for j in range(M - w):
                ops += [("F", w + j), ("B", j)]
            ops += [("B", j) for j in range(M - w, M)]
        out.append(ops)
    return out


@cache
def _plan(kind: str, stages: int, micro_batches: int) -> tuple[tuple[int, int, int, int], ...]:
    """A topological order of the ops: (node, same-stage predecessor, input predecessor, duration
    index 2 s + [0 forward | 1 backward]); node 0 is a sentinel finishing at 0."""
    S, M = stages, micro_batches
    ops = stage_ops("1f1b" if kind == "async_1f1b" else kind, S, M)
    node = {(s, k, m): 1 + s * 2 * M + i for s in range(S) for i, (k, m) in enumerate(ops[s])}
    pos = [0] * S
    order = []
    done: set[tuple[str, int, int]] = set()
    while len(order) < 2 * S * M:
        moved = False
        for s in range(S):
            while pos[s] < 2 * M:
                k, m = ops[s][pos[s]]
                dep = (
                    (s - 1, "F", m)
                    if k == "F" and s > 0
                    else (s + 1, "B", m)
                    if k == "B" and s < S - 1
                    else None
                )
                if dep is not None and dep not in done:
                    break
                prev = node[(s, *ops[s][pos[s] - 1])] if pos[s] > 0 else 0
                order.append((node[(s, k, m)], prev, node[dep] if dep else 0, 2 * s + (k == "B")))
                done.add((s, k, m))
                pos[s] += 1
                moved = True
        if not moved:  # cannot happen for the schedules above; a guard against a malformed order
            raise RuntimeError(f"schedule {kind} deadlocks at S={S}, M={M}")
    return tuple(order)


def iteration_time_s(kind: str, fwd_s, bwd_s, micro_batches: int) -> tuple[float, np.ndarray]:
    """The makespan of one synchronous iteration and the critical path's op counts.

    Returns:
        (makespan, counts): ``counts[s] = (forwards, backwards)`` of stage s on the longest path,
        so that the makespan is ``sum(counts[:, 0] * f + counts[:, 1] * b)``.
    """
    check_choice("schedule (synchronous)", kind, SYNCHRONOUS)
    durations = [x for pair in zip(fwd_s, bwd_s, strict=True) for x in pair]
    S = len(durations) // 2
    plan = _plan(kind, S, micro_batches)
    fin = [0.0] * (2 * S * micro_batches + 1)
    via = [0] * len(fin)
    for n, p1, p2, d in plan:
        a, b = fin[p1], fin[p2]
        if a >= b:
            fin[n], via[n] = a + durations[d], p1
        else:
            fin[n], via[n] = b + durations[d], p2
    last = max(range(len(fin)), key=fin.__getitem__)
    counts = np.zeros(2 * S)
    index = _duration_index(kind, S, micro_batches)
    node = last
    while node != 0:
        counts[index[node]] += 1
        node = via[node]
    return fin[last], counts.reshape(S, 2)


@cache
def _duration_index(kind: str, stages: int, micro_batches: int) -> dict[int, int]:
    return {n: d for n, _, _, d in _plan(kind, stages, micro_batches)}


def steady_period_s(fwd_s: np.ndarray, bwd_s: np.ndarray) -> float:
    """Async 1F1B's time per micro-batch in the steady state: max_s (f[s] + b[s])."""
    return float(np.max(np.asarray(fwd_s) + np.asarray(bwd_s)))


def bubble_fraction(
    makespan_s: float, fwd_s: np.ndarray, bwd_s: np.ndarray, micro_batches: int
) -> np.ndarray:
    """Per stage, the share of the iteration it waits: 1 - M (f[s] + b[s]) / makespan."""
    busy = micro_batches * (np.asarray(fwd_s) + np.asarray(bwd_s))
    return np.clip(1.0 - busy / makespan_s, 0.0, 1.0)


def in_flight(kind: str, stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once (and, under async 1F1B, the
    weight versions it stashes)."""
    if kind == "gpipe":
        return micro_batches
    return min(stages - stage, micro_batches)
