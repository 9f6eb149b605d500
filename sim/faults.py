"""Fault scenarios: throttling, interference, network jitter and congestion, slowdowns and losses.

Each fault source is a SimPy process that switches faults on and off in a shared
:class:`ClusterState`; the engine reads the state between events. Every random draw comes from the
generator handed to :class:`FaultInjector` (one seed drives the whole simulation).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from sim.validation import (
    check_choice,
    check_int,
    check_min_max,
    check_probability,
    check_range,
)

FAULT_KINDS = ("throttle", "interference", "congestion", "slowdown", "loss")


def _check_pair(field_name: str, pair: tuple[float, float], low: float, high: float) -> None:
    if len(pair) != 2:
        raise ValueError(f"{field_name} must be a (min, max) pair, got {pair!r}")
    check_range(f"{field_name}[0]", pair[0], low, high)
    check_range(f"{field_name}[1]", pair[1], low, high)
    check_min_max(f"{field_name}[0]", pair[0], f"{field_name}[1]", pair[1])


@dataclass(frozen=True)
class ThrottleSpec:
    """Thermal throttling: passively cooled GPUs under sustained load drop their clocks.

    Per affected worker, onsets arrive as a Poisson process of ``rate_per_hour``; each episode lasts
    U(duration_s) seconds and multiplies the GPU's speed by U(speed_factor).
    """

    gpu_types: tuple[str, ...] = ("T4",)
    rate_per_hour: float = 0.0
    duration_s: tuple[float, float] = (60.0, 300.0)
    speed_factor: tuple[float, float] = (0.4, 0.7)

    def __post_init__(self) -> None:
        check_range("throttle.rate_per_hour", self.rate_per_hour, 0.0, 3600.0)
        _check_pair("throttle.duration_s", self.duration_s, 1e-3, 1e7)
        _check_pair("throttle.speed_factor", self.speed_factor, 1e-3, 1.0)


@dataclass(frozen=True)
class InterferenceSpec:
    """Bursts of co-located jobs on a node: its GPUs and host pipelines slow down, its CPUs load up."""

    rate_per_hour: float = 0.0  # onsets per node per hour
    duration_s: tuple[float, float] = (30.0, 240.0)
    gpu_slowdown: tuple[float, float] = (1.2, 2.0)  # multiplies the GPU part of compute time
    host_slowdown: tuple[float, float] = (1.5, 4.0)  # multiplies the host / input-pipeline floor
    cpu_load: tuple[float, float] = (0.2, 0.6)  # CPU utilisation added by the neighbour
    worker_probability: float = 1.0  # chance that each worker of the node is hit by a burst

    def __post_init__(self) -> None:
        check_range("interference.rate_per_hour", self.rate_per_hour, 0.0, 3600.0)
        _check_pair("interference.duration_s", self.duration_s, 1e-3, 1e7)
        _check_pair("interference.gpu_slowdown", self.gpu_slowdown, 1.0, 100.0)
        _check_pair("interference.host_slowdown", self.host_slowdown, 1.0, 100.0)
        _check_pair("interference.cpu_load", self.cpu_load, 0.0, 1.0)
        check_probability("interference.worker_probability", self.worker_probability)


@dataclass(frozen=True)
class NetworkSpec:
    """Network jitter (per iteration) and congestion windows (events).

    Jitter: T_sync is multiplied by a log-normal factor of coefficient of variation
    ``bandwidth_cv`` and each ring step gains an exponential extra latency of mean
    ``latency_jitter_s``. Congestion: Poisson onsets; while congested the bandwidth is multiplied by
    U(congestion_bandwidth_factor) and the TCP segment loss probability rises to
    U(congestion_loss_rate), which shows up as retransmissions.
    """

    bandwidth_cv: float = 0.0
    latency_jitter_s: float = 0.0
    loss_rate: float = 1e-6
    congestion_rate_per_hour: float = 0.0
    congestion_duration_s: tuple[float, float] = (30.0, 180.0)
    congestion_bandwidth_factor: tuple[float, float] = (0.2, 0.6)
    congestion_loss_rate: tuple[float, float] = (1e-4, 1e-3)

    def __post_init__(self) -> None:
        check_range("network.bandwidth_cv", self.bandwidth_cv, 0.0, 5.0)
        check_range("network.latency_jitter_s", self.latency_jitter_s, 0.0, 10.0)
        check_probability("network.loss_rate", self.loss_rate)
        check_range("network.congestion_rate_per_hour", self.congestion_rate_per_hour, 0.0, 3600.0)
        _check_pair("network.congestion_duration_s", self.congestion_duration_s, 1e-3, 1e7)
        _check_pair("network.congestion_bandwidth_factor", self.congestion_bandwidth_factor, 1e-3, 1.0)
        _check_pair("network.congestion_loss_rate", self.congestion_loss_rate, 0.0, 1.0)


@dataclass(frozen=True)
class SlowdownSpec:
    """With ``probability`` per run, one random worker slows down (factor > 0) or is lost (factor 0)
    at U(start_s) for U(duration_s) seconds (inf: for the rest of the run). Losing or regaining a
    worker costs an elastic restart of ``restart_delay_s``."""

    probability: float = 0.0
    start_s: tuple[float, float] = (600.0, 3600.0)
    factor: tuple[float, float] = (0.3, 0.6)
    duration_s: tuple[float, float] = (math.inf, math.inf)
    restart_delay_s: float = 30.0

    def __post_init__(self) -> None:
        check_probability("slowdown.probability", self.probability)
        _check_pair("slowdown.start_s", self.start_s, 0.0, 1e9)
        _check_pair("slowdown.factor", self.factor, 0.0, 1.0)
        _check_pair("slowdown.duration_s", self.duration_s, 1e-3, math.inf)
        check_range("slowdown.restart_delay_s", self.restart_delay_s, 0.0, 1e5)


@dataclass(frozen=True)
class FaultWindow:
    """A scheduled fault at a fixed time (for controlled experiments and tests).

    ``kind``: throttle / slowdown (``factor`` = speed multiplier of ``worker``), interference
    (``factor`` = GPU and host slow-down multiplier of ``worker``), congestion (``factor`` =
    bandwidth multiplier; ``worker`` ignored), loss (``worker`` leaves for the window).
    """

    kind: str
    start_s: float
    duration_s: float
    worker: int = 0
    factor: float = 0.5

    def __post_init__(self) -> None:
        check_choice("fault window kind", self.kind, FAULT_KINDS)
        check_range("window.start_s", self.start_s, 0.0)
        check_range("window.duration_s", self.duration_s, 0.0, math.inf, low_open=True)
        check_int("window.worker", self.worker, 0)
        if self.kind == "interference":
            check_range("window.factor (interference slow-down)", self.factor, 1.0, 100.0)
        elif self.kind != "loss":
            check_range(f"window.factor ({self.kind})", self.factor, 0.0, 1.0, low_open=True)


@dataclass(frozen=True)
class Scenario:
    """Everything that perturbs a cluster during a run, plus measurement noise levels."""

    name: str
    description: str = ""
    throttle: ThrottleSpec = field(default_factory=ThrottleSpec)
    interference: InterferenceSpec = field(default_factory=InterferenceSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    slowdown: SlowdownSpec = field(default_factory=SlowdownSpec)
    windows: tuple[FaultWindow, ...] = ()
    worker_speed: tuple[float, ...] = ()  # static speed multiplier per worker; () means all 1.0
    compute_noise_cv: float = 0.03  # iteration-to-iteration variation of compute time
    measurement_noise_cv: float = 0.02  # noise on reported utilisation / throughput counters

    def __post_init__(self) -> None:
        for i, s in enumerate(self.worker_speed):
            check_range(f"scenario.worker_speed[{i}]", s, 0.0, 10.0, low_open=True)
        check_range("scenario.compute_noise_cv", self.compute_noise_cv, 0.0, 1.0)
        check_range("scenario.measurement_noise_cv", self.measurement_noise_cv, 0.0, 1.0)

    def validate_for(self, num_workers: int) -> None:
        if self.worker_speed and len(self.worker_speed) != num_workers:
            raise ValueError(
                f"scenario {self.name!r}: worker_speed has {len(self.worker_speed)} entries, "
                f"the cluster has {num_workers} workers"
            )
        for w in self.windows:
            if w.kind != "congestion" and w.worker >= num_workers:
                raise ValueError(
                    f"scenario {self.name!r}: fault window worker={w.worker} must be in "
                    f"[0, {num_workers - 1}]"
                )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            name="static_hetero",
            description="Static heterogeneity: T4s beside V100s, no transient faults.",
        ),
        Scenario(
            name="throttle",
            description="Transient thermal throttling of the passively cooled T4s.",
            throttle=ThrottleSpec(rate_per_hour=3.0, duration_s=(120.0, 600.0), speed_factor=(0.3, 0.6)),
        ),
        Scenario(
            name="jitter",
            description="Network jitter and congestion windows on the shared inter-node network.",
            network=NetworkSpec(
                bandwidth_cv=0.3,
                latency_jitter_s=2e-4,
                loss_rate=1e-5,
                congestion_rate_per_hour=6.0,
                congestion_duration_s=(60.0, 300.0),
                congestion_bandwidth_factor=(0.1, 0.4),
                congestion_loss_rate=(2e-4, 2e-3),
            ),
        ),
        Scenario(
            name="interference",
            description="Bursts of co-located jobs slowing nodes' GPUs and input pipelines.",
            interference=InterferenceSpec(
                rate_per_hour=3.0,
                duration_s=(120.0, 600.0),
                gpu_slowdown=(1.3, 2.5),
                host_slowdown=(2.0, 5.0),
                cpu_load=(0.3, 0.7),
                worker_probability=0.5,
            ),
        ),
    ]
}
SCENARIOS["mixed"] = Scenario(
    name="mixed",
    description="All of the above, plus a chance of one worker slowing down for good.",
    throttle=SCENARIOS["throttle"].throttle,
    interference=SCENARIOS["interference"].interference,
    network=SCENARIOS["jitter"].network,
    slowdown=SlowdownSpec(probability=0.5, start_s=(600.0, 3600.0), factor=(0.3, 0.6)),
)

# Fault families of dynamix-bench-v1 beyond the five above (conf/scenario/<name>.yaml spell them out).
SCENARIOS["loss_rejoin"] = Scenario(
    name="loss_rejoin",
    description="One worker is lost for 5-15 minutes, then rejoins; an elastic restart each time.",
    slowdown=SlowdownSpec(
        probability=1.0,
        start_s=(120.0, 900.0),
        factor=(0.0, 0.0),
        duration_s=(300.0, 900.0),
        restart_delay_s=30.0,
    ),
)
SCENARIOS["congestion_windows"] = Scenario(
    name="congestion_windows",
    description="Scheduled windows of heavy network congestion (bandwidth x0.1-0.25) at fixed times.",
    network=NetworkSpec(bandwidth_cv=0.1, latency_jitter_s=1e-4, loss_rate=1e-5),
    windows=tuple(
        FaultWindow(kind="congestion", start_s=start, duration_s=duration, factor=factor)
        for start, duration, factor in (
            (90.0, 180.0, 0.15),
            (600.0, 300.0, 0.1),
            (1500.0, 240.0, 0.25),
            (3000.0, 600.0, 0.15),
            (7200.0, 900.0, 0.1),
        )
    ),
)
SCENARIOS["short_throttles"] = Scenario(
    name="short_throttles",
    description="Frequent short throttling (10-45 s, ~30 an hour per GPU) of T4s and RTX 2080 Tis.",
    throttle=ThrottleSpec(
        gpu_types=("T4", "RTX2080Ti"), rate_per_hour=30.0, duration_s=(10.0, 45.0), speed_factor=(0.3, 0.6)
    ),
)
SCENARIOS["starved_input"] = Scenario(
    name="starved_input",
    description="CPU-starved input pipelines: host / data-loader floor x3-8 in bursts, GPUs at speed.",
    interference=InterferenceSpec(
        rate_per_hour=6.0,
        duration_s=(120.0, 900.0),
        gpu_slowdown=(1.0, 1.05),
        host_slowdown=(3.0, 8.0),
        cpu_load=(0.6, 0.9),
        worker_probability=0.75,
    ),
)


def get_scenario(name: str | Scenario) -> Scenario:
    if isinstance(name, Scenario):
        return name
    check_choice("scenario", name, SCENARIOS)
    return SCENARIOS[name]


def scale_intensity(scenario: Scenario, factor: float, name: str | None = None) -> Scenario:
    """The same scenario with every fault onset rate (and the jitter level) multiplied by
    ``factor``; used for domain randomisation."""
    check_range("intensity factor", factor, 0.0, 100.0)
    sc = scenario
    return replace(
        sc,
        name=name or f"{sc.name}x{factor:.2f}",
        throttle=replace(sc.throttle, rate_per_hour=sc.throttle.rate_per_hour * factor),
        interference=replace(sc.interference, rate_per_hour=sc.interference.rate_per_hour * factor),
        network=replace(
            sc.network,
            bandwidth_cv=min(sc.network.bandwidth_cv * factor, 5.0),
            congestion_rate_per_hour=sc.network.congestion_rate_per_hour * factor,
        ),
        slowdown=replace(sc.slowdown, probability=min(sc.slowdown.probability * factor, 1.0)),
    )


def compose_scenarios(parts: Sequence[Scenario], name: str | None = None) -> Scenario:
    """One scenario in which the fault processes of every scenario of ``parts`` run at once (the
    compound fault worlds of domain randomisation).

    Per process the most active part's spec is taken (the highest throttle onset rate, interference
    burst rate, congestion onset rate, slowdown probability; ties go to the earlier part); the
    network's per-iteration jitter takes the largest of each part's levels; scheduled windows are
    concatenated; the static speeds and the noise levels are the first part's (the noise levels
    the largest). An empty ``parts`` is an error; one part is returned unchanged.
    """
    if not parts:
        raise ValueError("compose_scenarios needs at least one scenario")
    parts = [get_scenario(p) for p in parts]
    if len(parts) == 1:
        return parts[0]
    first = parts[0]

    def most(key):
        return max(parts, key=key)  # max keeps the first of equal keys

    throttle = most(lambda p: p.throttle.rate_per_hour).throttle
    interference = most(lambda p: p.interference.rate_per_hour).interference
    slowdown = most(lambda p: p.slowdown.probability).slowdown
    congested = most(lambda p: p.network.congestion_rate_per_hour).network
    network = replace(
        congested,
        bandwidth_cv=max(p.network.bandwidth_cv for p in parts),
        latency_jitter_s=max(p.network.latency_jitter_s for p in parts),
        loss_rate=max(p.network.loss_rate for p in parts),
    )
    return replace(
        first,
        name=name or "+".join(p.name for p in parts),
        description="Compound: " + "; ".join(p.description or p.name for p in parts),
        throttle=throttle,
        interference=interference,
        network=network,
        slowdown=slowdown,
        windows=tuple(w for p in parts for w in p.windows),
        compute_noise_cv=max(p.compute_noise_cv for p in parts),
        measurement_noise_cv=max(p.measurement_noise_cv for p in parts),
    )


@dataclass(frozen=True)
class FaultEvent:
    """One line of the fault log: a fault started or ended."""

    time_s: float
    kind: str
    target: int  # worker (or node for interference bursts; -1 for the network)
    phase: str  # "start" | "end"
    value: float

    def __str__(self) -> str:
        who = "network" if self.target < 0 else f"worker {self.target}"
        return f"t={self.time_s:.1f}s {self.kind} {self.phase} on {who} ({self.value:.3g})"


@dataclass(frozen=True)
class ActiveFault:
    kind: str
    worker: int  # -1 for the network
    value: float  # speed factor (throttle, slowdown), GPU slow-down (interference), bandwidth factor
    host_slowdown: float = 1.0  # interference: multiplier of the host floor
    cpu_load: float = 0.0  # interference: CPU utilisation added
    loss_rate: float = 0.0  # congestion: TCP segment loss probability


class ClusterState:
    """Time-varying condition of every worker and the network, recomputed from the active faults.

    gpu_slowdown[i]  = prod(interference GPU factors on i) / (static_speed[i] * prod(speed factors))
    host_slowdown[i] = prod(interference host factors on i)
    """

    def __init__(self, num_workers: int, static_speed: np.ndarray) -> None:
        self.num_workers = num_workers
        self.static_speed = np.asarray(static_speed, dtype=np.float64)
        self._active: dict[int, ActiveFault] = {}
        self._next_id = 0
        self.pending_delay_s = 0.0
        self.log: list[FaultEvent] = []
        #: workers the job holds (an elastic allocation; all of them unless sim.elastic changes it)
        self.held = np.ones(num_workers, dtype=bool)
        self._recompute()

    def set_held(self, held: np.ndarray) -> None:
        """The workers the job holds from now on (the others are not in the training group)."""
        self.held = np.asarray(held, dtype=bool).copy()
        self._recompute()

    def start(self, fault: ActiveFault) -> int:
        fid = self._next_id
        self._next_id += 1
        self._active[fid] = fault
        self._recompute()
        return fid

    def end(self, fid: int) -> None:
        del self._active[fid]
        self._recompute()

    def _recompute(self) -> None:
        n = self.num_workers
        speed = self.static_speed.copy()
        gpu_mult = np.ones(n)
        host_mult = np.ones(n)
        cpu_load = np.zeros(n)
        alive = np.ones(n, dtype=bool)
        bandwidth = 1.0
        loss_rate = 0.0
        for f in self._active.values():
            if f.kind in ("throttle", "slowdown"):
                speed[f.worker] *= f.value
            elif f.kind == "interference":
                gpu_mult[f.worker] *= f.value
                host_mult[f.worker] *= f.host_slowdown
                cpu_load[f.worker] += f.cpu_load
            elif f.kind == "loss":
                alive[f.worker] = False
            elif f.kind == "congestion":
                bandwidth *= f.value
                loss_rate = max(loss_rate, f.loss_rate)
        self.speed = speed
        self.gpu_slowdown = gpu_mult / speed
        self.host_slowdown = host_mult
        self.cpu_load = np.minimum(cpu_load, 1.0)
        self.alive = alive & self.held
        self.bandwidth_factor = bandwidth
        self.congestion_loss_rate = loss_rate


class FaultInjector:
    """Starts the SimPy processes of a scenario on a cluster; all draws from ``rng``."""

    def __init__(
        self,
        env: simpy.Environment,
        state: ClusterState,
        scenario: Scenario,
        gpu_types: tuple[str, ...],
        node_of_worker: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        self.env = env
        self.state = state
        self.scenario = scenario
        self.rng = rng
        sc = scenario
        n = len(gpu_types)
        if sc.throttle.rate_per_hour > 0:
            for w in range(n):
                if gpu_types[w] in sc.throttle.gpu_types:
                    env.process(self._throttle(w))
        if sc.interference.rate_per_hour > 0:
            for node in np.unique(node_of_worker):
                env.process(self._interference(np.flatnonzero(node_of_worker == node)))
        if sc.network.congestion_rate_per_hour > 0:
            env.process(self._congestion())
        if sc.slowdown.probability > 0 and rng.random() < sc.slowdown.probability:
            env.process(self._slowdown(int(rng.integers(n))))
        for window in sc.windows:
            env.process(self._window(window))

    # --- helpers ---------------------------------------------------------------------------------
    def _uniform(self, pair: tuple[float, float]) -> float:
        lo, hi = pair
        return lo if lo == hi else float(self.rng.uniform(lo, hi))

    def _gap(self, rate_per_hour: float) -> float:
        return float(self.rng.exponential(3600.0 / rate_per_hour))

    def _log(self, kind: str, target: int, phase: str, value: float) -> None:
        self.state.log.append(FaultEvent(self.env.now, kind, target, phase, value))

    def _episode(self, fault: ActiveFault, duration: float) -> Iterator:
        fid = self.state.start(fault)
        self._log(fault.kind, fault.worker, "start", fault.value)
        if fault.kind == "loss":
            self.state.pending_delay_s += self.scenario.slowdown.restart_delay_s
        if math.isinf(duration):
            return
        yield self.env.timeout(duration)
        self.state.end(fid)
        self._log(fault.kind, fault.worker, "end", fault.value)
        if fault.kind == "loss":
            self.state.pending_delay_s += self.scenario.slowdown.restart_delay_s

    # --- processes -------------------------------------------------------------------------------
    def _throttle(self, worker: int) -> Iterator:
        spec = self.scenario.throttle
        while True:
            yield self.env.timeout(self._gap(spec.rate_per_hour))
            fault = ActiveFault("throttle", worker, self._uniform(spec.speed_factor))
            yield from self._episode(fault, self._uniform(spec.duration_s))

    def _interference(self, workers: np.ndarray) -> Iterator:
        spec = self.scenario.interference
        while True:
            yield self.env.timeout(self._gap(spec.rate_per_hour))
            duration = self._uniform(spec.duration_s)
            hit = workers[self.rng.random(len(workers)) < spec.worker_probability]
            started = []
            for w in hit:
                fault = ActiveFault(
                    "interference",
                    int(w),
                    self._uniform(spec.gpu_slowdown),
                    host_slowdown=self._uniform(spec.host_slowdown),
                    cpu_load=self._uniform(spec.cpu_load),
                )
                started.append((fault, self.state.start(fault)))
                self._log("interference", int(w), "start", fault.value)
            yield self.env.timeout(duration)
            for fault, fid in started:
                self.state.end(fid)
                self._log("interference", fault.worker, "end", fault.value)

    def _congestion(self) -> Iterator:
        spec = self.scenario.network
        while True:
            yield self.env.timeout(self._gap(spec.congestion_rate_per_hour))
            fault = ActiveFault(
                "congestion",
                -1,
                self._uniform(spec.congestion_bandwidth_factor),
                loss_rate=self._uniform(spec.congestion_loss_rate),
            )
            yield from self._episode(fault, self._uniform(spec.congestion_duration_s))

    def _slowdown(self, worker: int) -> Iterator:
        spec = self.scenario.slowdown
        yield self.env.timeout(self._uniform(spec.start_s))
        factor = self._uniform(spec.factor)
        kind = "loss" if factor == 0.0 else "slowdown"
        yield from self._episode(ActiveFault(kind, worker, factor), self._uniform(spec.duration_s))

    def _window(self, window: FaultWindow) -> Iterator:
        yield self.env.timeout(window.start_s)
        if window.kind == "interference":
            fault = ActiveFault("interference", window.worker, window.factor, host_slowdown=window.factor)
        elif window.kind == "congestion":
            loss = self.scenario.network.congestion_loss_rate[1]
            fault = ActiveFault("congestion", -1, window.factor, loss_rate=loss)
        else:
            fault = ActiveFault(window.kind, window.worker, window.factor)
        yield from self._episode(fault, window.duration_s)
