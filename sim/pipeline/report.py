"""What one interval of pipeline training measured (the pipeline env's one message from a backend).

Per-stage arrays have one entry per stage; ``link_bytes_per_s`` one per boundary (S - 1). Times are
means over the interval's iterations; ``truth`` is the simulator's hidden state (``None`` on a real
backend) and only oracles, the hindsight limit and the forest's training read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from sim.protocol import _same


@dataclass(frozen=True, eq=False)
class PipelineReport:
    sizes: tuple[int, ...]  # blocks per stage
    micro_batches: int  # M
    schedule: str
    fwd_time_s: np.ndarray  # (S,) forward compute of one micro-batch
    bwd_time_s: np.ndarray  # (S,) backward compute of one micro-batch
    send_time_s: np.ndarray  # (S,) sending its activations and gradients, per micro-batch
    bubble_fraction: np.ndarray  # (S,) share of the iterations' time the stage waits
    idle_fraction: np.ndarray  # (S,) share of the interval's wall time it is not computing
    gpu_util: np.ndarray  # (S,) device busy fraction (a counter, with measurement noise)
    mem_util: np.ndarray  # (S,) stage memory over its worker's
    link_bytes_per_s: np.ndarray  # (S - 1,) bytes sent over each boundary per second
    iteration_time_s: float  # mean over the interval's iterations
    iterations: int
    interval_time_s: float  # wall time of the interval, pauses included
    wall_time_s: float  # since the start of the run
    repartition_time_s: float  # pause of a re-partition at the start of the interval
    stall_time_s: float  # waiting for a lost worker to come back
    val_accuracy: float  # validation quality (a rising fraction), measured
    samples: int
    events: tuple[str, ...] = ()
    truth: Mapping[str, Any] | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        """Field-by-field equality (arrays elementwise, ``truth`` key by key)."""
        if not isinstance(other, PipelineReport):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    __hash__ = None  # type: ignore[assignment]

    @property
    def num_stages(self) -> int:
        return len(self.sizes)
