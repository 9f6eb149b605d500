"""One cluster's fault history, drawn ahead by the SimPy fault processes and read back by time.

Faults do not depend on the controller: the processes of :class:`sim.faults.FaultInjector` draw from
their own child stream, and SimPy orders their events by (time, priority, scheduling order) however
often the clock is advanced. :class:`FaultTimeline` therefore runs those very processes on a clock of
its own, one event at a time, and records after every event the :class:`sim.faults.ClusterState` it
left (the state's arrays are rebuilt, never mutated, on every change, so a record holds references),
the elastic-restart delay it added and the fault log. The batched engine (:mod:`sim.batched`) reads
the record where :class:`sim.engine.Simulator` would step its own clock: the same events, in the same
order, at the same times, with the same draws. Events are drawn on demand, a chunk at a time, as the
reader asks for times beyond those drawn so far; the draws do not depend on when they are made.

Every event is recorded, those that change nothing too (a process starting at time 0, an
interference burst that hits no worker): the engine splits an interval at every event its clock
holds, so the batched one must split at the same times to add the same segments.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from sim.faults import ClusterState, FaultEvent, FaultInjector, Scenario

#: Events drawn at a time when the reader runs past the drawn ones (few: an episode may end first).
_CHUNK_EVENTS = 4


class FaultTimeline:
    """The fault events of one run of ``scenario`` on a cluster, all draws from ``rng``.

    Args:
        scenario: the run's scenario (validated for the cluster by the caller).
        gpu_types: the GPU type of each of the cluster's workers.
        node_of_worker: the node of each of the cluster's workers.
        rng: the fault stream (:meth:`sim.engine.Simulator.reset` spawns it as its first child).

    ``time(i)`` is the time of event ``i`` (``inf`` past the last one); ``state(i)`` the cluster
    state after it (``state(-1)``: before any event); ``delay(i)`` the elastic-restart delay it adds;
    ``log_end(i)`` the length of the fault log after it.
    """

    def __init__(
        self,
        scenario: Scenario,
        gpu_types: tuple[str, ...],
        node_of_worker: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        n = len(gpu_types)
        speed = np.asarray(scenario.worker_speed or np.ones(n), dtype=np.float64)
        self._env = simpy.Environment()
        self._state = ClusterState(n, speed)
        FaultInjector(self._env, self._state, scenario, gpu_types, node_of_worker, rng)
        self.initial = self._snapshot()
        self._times: list[float] = []
        self._states: list[tuple] = []
        self._delays: list[float] = []
        self._log_ends: list[int] = []
        self._done = False

    def _snapshot(self) -> tuple:
        st = self._state
        return (st.gpu_slowdown, st.host_slowdown, st.cpu_load, st.alive, st.speed,
                st.bandwidth_factor, st.congestion_loss_rate)  # fmt: skip

    def _draw(self, upto: int) -> None:
        """Run the processes until event ``upto`` is recorded (or no event is left)."""
        env, st = self._env, self._state
        while len(self._times) <= upto and not self._done:
            for _ in range(_CHUNK_EVENTS):
                if math.isinf(env.peek()):
                    self._done = True
                    break
                env.step()
                self._times.append(env.now)
                self._states.append(self._snapshot())
                self._delays.append(st.pending_delay_s)
                st.pending_delay_s = 0.0
                self._log_ends.append(len(st.log))

    def time(self, i: int) -> float:
        if i >= len(self._times):
            self._draw(i)
            if i >= len(self._times):
                return math.inf
        return self._times[i]

    def state(self, i: int) -> tuple:
        """(gpu_slowdown, host_slowdown, cpu_load, alive, speed, bandwidth_factor, loss_rate) after
        event ``i`` (``-1``: the state before the first event)."""
        return self.initial if i < 0 else self._states[i]

    def delay(self, i: int) -> float:
        return self._delays[i]

    def log_end(self, i: int) -> int:
        return 0 if i < 0 else self._log_ends[i]

    def log(self, start: int, end: int) -> list[FaultEvent]:
        """Fault log lines ``start:end``."""
        return self._state.log[start:end]
