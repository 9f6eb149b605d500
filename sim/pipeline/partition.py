"""Partitions of a model's blocks into contiguous stages, stage placement, and the memory check.

A partition is the number of blocks of each stage, ``sizes`` (each >= 1, summing to the model's
blocks); stage s holds blocks ``[bounds[s], bounds[s + 1])``. Memory of one replica of stage s:

    mem(s) = versions(s) * state(s)                                 # parameters + optimiser state
             + in_flight(s) * activation_bytes(s) * micro_batch / R  # stashed activations
    versions(s) = in_flight(s) under async 1F1B (weight stashing), else 1

A partition over a replica's memory cap is refused (:class:`PipelineMemoryError`), never clipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.pipeline.model import PipelineModel
from sim.pipeline.schedule import in_flight
from sim.validation import check_int

GIB = 1024.0**3


class PipelineMemoryError(ValueError):
    """A stage does not fit its worker's memory."""


def check_sizes(sizes: Sequence[int], num_blocks: int) -> tuple[int, ...]:
    """``sizes`` as a tuple if every stage holds >= 1 block and they sum to ``num_blocks``."""
    out = tuple(check_int(f"partition sizes[{i}]", s, 1, num_blocks) for i, s in enumerate(sizes))
    if not out:
        raise ValueError("a partition needs at least one stage")
    if sum(out) != num_blocks:
        raise ValueError(f"partition sizes {list(out)} sum to {sum(out)}, the model has {num_blocks} blocks")
    return out


def bounds(sizes: Sequence[int]) -> np.ndarray:
    """Block boundaries: stage s holds ``[bounds[s], bounds[s + 1])``."""
    return np.concatenate(([0], np.cumsum(sizes))).astype(int)


def even_split(num_blocks: int, stages: int) -> tuple[int, ...]:
    """The static even split by block count (the first ``num_blocks % stages`` stages one more)."""
    check_int("stages", stages, 1, num_blocks)
    q, r = divmod(num_blocks, stages)
    return tuple(q + (i < r) for i in range(stages))


def placement(num_workers: int, stages: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous groups of workers, one per stage, ``num_workers // stages`` replicas each."""
    check_int("stages", stages, 1, num_workers)
    if num_workers % stages:
        raise ValueError(f"stages ({stages}) must divide the cluster's {num_workers} workers")
    r = num_workers // stages
    return tuple(tuple(range(s * r, (s + 1) * r)) for s in range(stages))


def stage_memory_bytes(
    model: PipelineModel, sizes: Sequence[int], kind: str, micro_batches: int, replicas: Sequence[int]
) -> np.ndarray:
    """Bytes one replica of each stage holds (see the module docstring)."""
    b = bounds(sizes)
    S = len(sizes)
    out = np.empty(S)
    for s in range(S):
        flight = in_flight(kind, s, S, micro_batches)
        versions = flight if kind == "async_1f1b" else 1
        per_replica = model.micro_batch / replicas[s]
        out[s] = (
            versions * model.state_bytes(b[s], b[s + 1])
            + flight * model.activation_bytes(b[s], b[s + 1]) * per_replica
        )
    return out


def check_memory(
    model: PipelineModel,
    sizes: Sequence[int],
    kind: str,
    micro_batches: int,
    replicas: Sequence[int],
    cap_bytes: Sequence[float],
) -> np.ndarray:
    """The stages' memory (bytes); :class:`PipelineMemoryError` naming the first stage over its cap."""
    mem = stage_memory_bytes(model, sizes, kind, micro_batches, replicas)
    over = np.flatnonzero(mem > np.asarray(cap_bytes))
    if over.size:
        s = int(over[0])
        raise PipelineMemoryError(
            f"stage {s} ({sizes[s]} blocks, {kind}, {micro_batches} micro-batches) needs "
            f"{mem[s] / GIB:.2f} GiB, over its worker's {cap_bytes[s] / GIB:.2f} GiB; move blocks off it "
            "or run fewer micro-batches"
        )
    return mem
