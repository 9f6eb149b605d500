"""A DDP communication hook that measures what the interval report needs, and injects slowness.

Registered with ``ddp_model.register_comm_hook(stats, grad_stats_hook)``, it replaces DDP's default
all-reduce hook (sum, then divide by the world size: the same arithmetic) and, per iteration:

* sums the squares of this rank's *local* gradient buckets before the all-reduce (``local_sqr``)
  and, in :meth:`GradStats.finish` after ``backward``, of the all-reduced ones (``global_sqr``): the
  two-batch noise-scale inputs (only on iterations with ``measure``; no Python callback runs on
  the communication thread);
* stamps the moment the last bucket is ready (``t_ready``): local compute ends there, the wait for
  the slowest rank and the exposed all-reduce begin;
* emulates a slower device: before launching the last bucket's all-reduce it sleeps
  ``(slowdown - 1) * (t_ready - t_start)``, so the rank's compute takes ``slowdown`` times as long
  as measured (``sim.faults`` speed factors, emulated GPU types).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class GradStats:
    """Per-iteration state shared between the training loop and :func:`grad_stats_hook`."""

    world_size: int
    cuda: bool = False
    slowdown: float = 1.0  # compute-time multiplier to emulate (>= 1)
    measure: bool = True  # take the gradient norms this iteration
    t_start: float = 0.0  # set by the loop when the iteration's input pipeline starts
    t_ready: float = 0.0  # last bucket ready (local backward done)
    injected_s: float = 0.0  # emulated extra compute slept this iteration
    local_sqr: float = 0.0  # |local gradient|^2 as seen by the hook (before averaging)
    global_sqr: float = 0.0  # |all-reduced gradient|^2 (after :meth:`finish`)
    group: "dist.ProcessGroup | None" = None
    reduced: list = field(default_factory=list, repr=False)  # this iteration's all-reduced buckets

    def begin(self, slowdown: float = 1.0, measure: bool = True) -> None:
        """Start an iteration: reset the accumulators and stamp the start."""
        self.slowdown = max(float(slowdown), 1.0)
        self.measure = measure
        self.local_sqr = 0.0
        self.global_sqr = 0.0
        self.injected_s = 0.0
        self.t_ready = 0.0
        self.reduced.clear()
        self.t_start = time.perf_counter()

    def finish(self) -> float:
        """After ``backward`` (the all-reduce is complete): |all-reduced gradient|^2."""
        if self.reduced:
            self.global_sqr = float(sum(torch.dot(b, b) for b in self.reduced))
            self.reduced.clear()
        return self.global_sqr


def grad_stats_hook(state: GradStats, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    if state.measure and buf.dtype.is_floating_point:
        state.local_sqr += float(torch.dot(buf, buf))
        state.reduced.append(buf)  # reduced in place: read by finish() once backward returns
    if bucket.is_last():
        if state.cuda:
            torch.cuda.synchronize()
        state.t_ready = time.perf_counter()
        if state.slowdown > 1.0:
            extra = (state.slowdown - 1.0) * (state.t_ready - state.t_start)
            time.sleep(extra)
            state.injected_s = extra
    buf.div_(state.world_size)
    return dist.all_reduce(buf, group=state.group, async_op=True).get_future().then(_first)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]  # as torch's default all-reduce hook: the future must yield the bucket
