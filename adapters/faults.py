"""The simulator's fault scenarios, injected into real workers as measured delays.

The same :class:`sim.faults.Scenario` objects drive both backends. Here the scenario's SimPy
processes (:class:`sim.faults.FaultInjector`) run on a clock that follows the real run's wall clock
(times ``time_scale``: with ``time_scale = 60`` an hour of fault activity plays out in a minute), and
at the start of every interval the active faults become per-worker factors:

    slowdown[i]     = emulated_gpu[i](b_i) * gpu_slowdown[i] / min_{j alive} gpu_slowdown[j]
                      # rank i sleeps (slowdown[i] - 1) x its measured compute each iteration
    gpu_slowdown[i] = prod(interference factors on i) / (worker_speed[i] * prod(throttle/slowdown factors))
    emulated_gpu[i](b) = T_compute(type_i, b) / min_types T_compute(type, b)   # sim.hardware models

An emulated rank is as many times slower than the fastest emulated type *at its own batch* as the
fitted compute models say (the host stands in for that fastest type).

Network faults add the same delay to every rank after each all-reduce (one shared draw, so every
rank waits equally):

    net_delay[k] = (2 (R - 1) latency[k] + comm_s * (1 / bandwidth_factor - 1)) * jitter[k]
    latency[k] ~ Exp(latency_jitter_s),  jitter[k] = lognormal(cv = bandwidth_cv)

``comm_s`` is the all-reduce time measured in the previous interval. A ``loss`` fault makes the
worker sit the interval out (local batch 0: it joins every collective with a zero gradient, and
the report marks it not alive). A change of the compute factors takes effect at the first iteration
that starts after its time, inside an interval as in the simulator (``slowdown_changes``: the
scenario's timeline drawn ahead from the same seeds, :class:`sim.fault_timeline.FaultTimeline`);
a loss and the network faults start and end at interval boundaries. Injected network
faults are delays only: they do not make the kernel retransmit, so ``tcp_retransmissions`` stays
what the kernel measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from sim.fault_timeline import FaultTimeline
from sim.faults import ClusterState, FaultInjector, Scenario, get_scenario
from sim.hardware import ComputeModel, compute_params

#: How far ahead (real seconds) an interval's compute-fault changes are looked up.
LOOKAHEAD_S = 600.0


@dataclass(frozen=True)
class IntervalFaults:
    """What the workers must inject during one interval."""

    slowdown: np.ndarray  # (N,) compute multipliers >= 1
    alive: np.ndarray  # (N,) bool
    net_delay_s: np.ndarray  # (K,) extra seconds after each all-reduce, same for every rank
    events: tuple[str, ...]
    #: (real seconds after the interval's start, (N,) compute multipliers from then on), in time
    #: order: the compute faults that change within the look-ahead horizon
    slowdown_changes: tuple[tuple[float, np.ndarray], ...] = ()


class EmulatedGpuTypes:
    """Per-worker compute multipliers that make homogeneous hardware behave like ``gpu_types``."""

    def __init__(self, gpu_types: tuple[str, ...], app: str = "cifar10") -> None:
        self.gpu_types = gpu_types
        self.models = [ComputeModel(compute_params(g, app)) for g in gpu_types]

    def slowdown(self, local_batches: np.ndarray) -> np.ndarray:
        b = np.maximum(np.asarray(local_batches, dtype=np.float64), 1.0)
        # T_i(b_i) relative to the fastest type at the same batch.
        own = np.array([float(m.compute_time_s(bi)) for m, bi in zip(self.models, b, strict=True)])
        best = np.array([min(float(m.compute_time_s(bi)) for m in self.models) for bi in b])
        return own / best


class FaultEmulator:
    """Plays a :class:`Scenario` against the real clock; one generator for every draw.

    Args:
        scenario: a :class:`Scenario` or preset name (``None``: no faults).
        num_workers: ranks.
        gpu_types: per-worker type names (for the scenario's throttling of given types).
        emulate: per-worker GPU types to emulate (``None``: all ranks run at native speed).
        time_scale: fault-clock seconds per real second.
        emulate_app: which measured application's compute models set the emulated speeds.
    """

    def __init__(
        self,
        scenario: str | Scenario | None,
        num_workers: int,
        gpu_types: tuple[str, ...],
        *,
        emulate: tuple[str, ...] | None = None,
        time_scale: float = 1.0,
        emulate_app: str = "cifar10",
    ) -> None:
        self.scenario = get_scenario(scenario) if scenario is not None else Scenario(name="none")
        self.scenario.validate_for(num_workers)
        if time_scale <= 0:
            raise ValueError(f"fault time_scale must be > 0, got {time_scale!r}")
        if emulate is not None and len(emulate) != num_workers:
            raise ValueError(f"emulate lists {len(emulate)} GPU types for {num_workers} workers")
        self.num_workers = num_workers
        self.gpu_types = gpu_types
        self.time_scale = float(time_scale)
        self.gpu = EmulatedGpuTypes(tuple(emulate), emulate_app) if emulate else None
        self._seed: int | None = None

    def reset(self, seed: int, start_s: float = 0.0) -> None:
        """Fresh fault processes from ``seed``; fast-forwarded to ``start_s`` real seconds (resume)."""
        self._seed = int(seed)
        self.rng = np.random.default_rng([self._seed, 1])
        self.env = simpy.Environment()
        speed = np.asarray(self.scenario.worker_speed or (1.0,) * self.num_workers, dtype=np.float64)
        self.state = ClusterState(self.num_workers, speed)
        self.injector = FaultInjector(
            self.env,
            self.state,
            self.scenario,
            self.gpu_types,
            np.arange(self.num_workers),  # one rank per emulated node
            np.random.default_rng([self._seed, 2]),
        )
        # The same processes on the same stream, drawn ahead: what changes within an interval.
        self.ahead = FaultTimeline(
            self.scenario, self.gpu_types, np.arange(self.num_workers), np.random.default_rng([self._seed, 2])
        )
        self._ahead_i = 0
        self._logged = 0
        self.advance(start_s)
        self._logged = len(self.state.log)

    def advance(self, wall_s: float) -> None:
        until = wall_s * self.time_scale
        if until > self.env.now:
            self.env.run(until=until)

    def interval(
        self, wall_s: float, local_batches: np.ndarray, iterations: int, comm_s: float
    ) -> IntervalFaults:
        """Fault factors for an interval starting at real time ``wall_s`` (since the run began)."""
        self.advance(wall_s)
        st, net = self.state, self.scenario.network
        slow = np.asarray(st.gpu_slowdown, dtype=np.float64).copy()
        alive = st.alive.copy()
        # Relative to the fastest live rank, which runs at native speed (sleeping cannot speed up).
        if alive.any():
            slow = slow / slow[alive].min()
        if self.gpu is not None:
            slow *= self.gpu.slowdown(local_batches)
        r = int(alive.sum())
        cv = net.bandwidth_cv
        jitter = np.exp(cv * self.rng.standard_normal(iterations) - 0.5 * cv**2)
        latency = self.rng.exponential(1.0, iterations) * net.latency_jitter_s
        ring = 2 * max(r - 1, 0) * latency
        congestion = max(comm_s, 0.0) * (1.0 / st.bandwidth_factor - 1.0)
        delay = np.maximum((ring + congestion) * jitter, 0.0) if r > 1 else np.zeros(iterations)
        new = st.log[self._logged :]
        self._logged = len(st.log)
        slowdown = np.maximum(slow, 1.0)
        return IntervalFaults(
            slowdown=slowdown,
            alive=alive,
            net_delay_s=delay,
            events=tuple(str(e) for e in new),
            slowdown_changes=self._changes(wall_s, local_batches, alive, slowdown),
        )

    def _changes(
        self, wall_s: float, local_batches: np.ndarray, alive: np.ndarray, current: np.ndarray
    ) -> tuple[tuple[float, np.ndarray], ...]:
        """The compute multipliers' changes after ``wall_s`` within :data:`LOOKAHEAD_S` real seconds
        (the drawn-ahead timeline's events past the fault clock, the alive set held)."""
        now, tl = self.env.now, self.ahead
        while tl.time(self._ahead_i) <= now:
            self._ahead_i += 1
        out, prev, i = [], current, self._ahead_i
        horizon = now + LOOKAHEAD_S * self.time_scale
        while (t := tl.time(i)) <= horizon:
            slow = np.asarray(tl.state(i)[0], dtype=np.float64).copy()
            if alive.any():
                slow = slow / slow[alive].min()
            if self.gpu is not None:
                slow *= self.gpu.slowdown(local_batches)
            slow = np.maximum(slow, 1.0)
            if not np.array_equal(slow, prev):
                out.append((t / self.time_scale - wall_s, slow))
                prev = slow
            i += 1
        return tuple(out)
