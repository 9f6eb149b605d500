"""The simulator as a backend, and its ground-truth handle for oracles."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sim.cluster import ClusterSpec, default_cluster
from sim.engine import Simulator, validation_sd
from sim.faults import Scenario
from sim.guards import Guard, GuardConfig, GuardedBackend
from sim.hardware import smooth_max
from sim.profile import ClusterProfile
from sim.protocol import COMPUTE_CURVE_POINTS, BackendSpec, IntervalReport, compute_curve_batches
from sim.workloads import Workload


class SimBackend(GuardedBackend):
    """Wraps :class:`sim.engine.Simulator` in the backend protocol.

    Args:
        cluster: preset name or :class:`ClusterSpec`; ignored when ``workers`` is given. ``None``:
            the profile's cluster, else ``"t4v100"``.
        workers: build the default T4/V100 mix with this many workers.
        workload: preset name or spec (``None``: the profile's, else ``"cifar10"``).
        scenario: preset name or spec.
        initial_batch: local batch of every worker in the first interval (default: the workload's,
            limited to each worker's range).
        profile: a calibrated cluster profile (path, name or ``sim.profile.ClusterProfile``;
            see :class:`Simulator`).
        guards: the guards of the real paths, modelled (:mod:`sim.guards`; a
            :class:`~sim.guards.GuardConfig`, its fields or a mode name): the cap and back-off of the
            learning rate enter progress, the ramp the chance of a collapse (``instability``), and
            the watchdog rolls the run's progress back, the clock running on. ``None`` (default):
            none, as the shipped results were made.
        **sim_kwargs: passed to :class:`Simulator` (``reconfig_delay_s``, ``min_batch``, ``lr_rule``,
            ``interval_overhead_s``, ``instability``).
    """

    def __init__(
        self,
        cluster: str | ClusterSpec | None = None,
        workload: str | Workload | None = None,
        scenario: str | Scenario = "static_hetero",
        *,
        workers: int | None = None,
        initial_batch: int | None = None,
        time_budget_s: float | None = None,
        profile: str | Path | ClusterProfile | None = None,
        guards: GuardConfig | dict | str | None = None,
        **sim_kwargs,
    ) -> None:
        if workers is not None and profile is not None:
            raise ValueError(
                "workers= builds the default T4/V100 mix, which a profile does not describe; "
                "give the profiled cluster as cluster= (or leave both out to use the profile's)"
            )
        spec = default_cluster(workers) if workers is not None else cluster
        self.sim = Simulator(spec, workload, scenario, profile=profile, **sim_kwargs)
        sim = self.sim
        self.spec = simulator_spec(sim, initial_batch, time_budget_s)
        self.ground_truth = SimGroundTruth(sim)
        #: the modelled guards (sim.guards.Guard); None: none (the env then sees a plain backend)
        self.guard = Guard(guards) if guards is not None else None
        if self.guard is not None and self.guard.config.acts:
            sim.convergence.max_gain = self.guard.config.max_lr_gain
            sim.lr_ramped = self.guard.config.ramp_iters() > 0

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        self.sim.reset(seed=seed, rng=rng)
        self._intervals = 0
        if self.guard is not None:
            self.guard.reset()
            self.sim.convergence.lr_scale = 1.0

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        if self.guard is None:
            return self.sim.run_interval(local_batches, iterations)
        return self.guarded_interval(np.asarray(local_batches, dtype=np.int64), iterations)

    # --- the modelled guards (sim.guards.GuardedBackend) ---------------------------------------------
    def wall_time_s(self) -> float:
        return self.sim.now_s

    def _interval(self, b: np.ndarray, k_iters: int) -> IntervalReport:
        self.sim.convergence.lr_scale = self.guard.lr_scale  # the back-off of the rollbacks so far
        report = self.sim.run_interval(b, k_iters)
        self._intervals += 1
        return report

    def _take_snapshot(self) -> None:
        inst = self.sim.instability
        self._held = (self.sim.training_state(), inst.state_dict() if inst is not None else None)

    def _restore_snapshot(self) -> None:
        state, inst = self._held
        self.sim.load_training_state(state)
        if inst is not None:
            self.sim.instability.load_state_dict(inst)

    def close(self) -> None:
        self.sim.close()


class SimGroundTruth:
    """The simulator's noise-free models at its current fault state (:class:`sim.protocol.GroundTruth`).

    A live view of the simulator, not data: vectorised envs deep-copy every info, so a deep copy
    shares it; pickling (an info sent across a process boundary) gives ``None``, as an oracle in
    another process than the simulator has no ground truth to ask; and any two handles compare
    equal, so that infos compare by their data (the seeding checks of Gymnasium and PettingZoo
    compare the infos of two envs).
    """

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim

    def compute_time_s(self, local_batches: np.ndarray) -> np.ndarray:
        return self._sim.compute_time_s(local_batches)

    def iteration_time_s(self, local_batches: np.ndarray) -> float:
        return self._sim.iteration_time_s(local_batches)

    def progress_per_step(self, global_batch: float, progress: float) -> float:
        """Progress one step at ``global_batch`` makes at ``progress`` on the path that holds it from
        now. A model with a split noise (:attr:`sim.convergence.ConvergenceModel.split_noise`) reads
        its gradient statistics at the statistics' counter q, not at the progress p: from the
        simulator's (p, q) now, q moves by the ratio of the two counters' rates at ``global_batch``
        (exact for a path short against the noise scale's change; the simulator itself advances both
        counters exactly). Without a split q is p, and this is the model's rate at ``progress``."""
        sim = self._sim
        conv = sim.convergence
        if not conv.split_noise:
            return conv.progress_per_step(global_batch, progress)
        p0, q0 = sim.progress, sim.noise_progress
        dp = conv.progress_per_step(global_batch, p0, q0)
        ratio = conv.noise_progress_per_step(global_batch, q0) / dp if dp > 0.0 else 1.0
        q = max(q0 + (progress - p0) * ratio, 0.0)
        return conv.progress_per_step(global_batch, progress, q)

    def progress_to_target(self, global_batches: np.ndarray, quality: float | None = None) -> np.ndarray:
        sim = self._sim
        memory = sim.batch_memory_log2
        if memory is None:  # before the first interval: the memory starts at the first batch
            memory = math.log2(float(np.max(global_batches)))
        target = sim.workload.target_quality if quality is None else float(quality)
        return sim.convergence.progress_to_accuracy(
            target, np.asarray(global_batches, dtype=np.float64), sim.progress, memory
        )

    def validation_sd(self, quality: float) -> float:
        return float(validation_sd(quality, self._sim.workload.val_samples))

    def collapse_risk(self, global_batches: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        """For each of ``global_batches`` run in the next interval (:mod:`sim.instability`): the
        chance that it collapses training (a rise of the learning-rate multiplier past its value in
        the last interval, under the guards' ramp when on), the share of progress a collapse loses,
        and whether training would stay stuck there (a collapse happened and the rate that caused it
        would still stand); zeros, 0 and all False where the simulator models no instability."""
        sim = self._sim
        gbs = np.asarray(global_batches, dtype=np.float64)
        inst = sim.instability
        chance, stuck = np.zeros(len(gbs)), np.zeros(len(gbs), dtype=bool)
        if inst is None or inst.last_batch is None:  # off, or the first interval: nothing rose yet
            return chance, 0.0 if inst is None else float(inst.params.depth), stuck
        for i, m in enumerate(gbs):
            gain = sim.convergence.lr_multiplier(float(m), sim.progress)
            if m > inst.last_batch and gain > inst.last_gain:
                chance[i] = inst.params.chance(gain, sim.lr_ramped)
            stuck[i] = inst.stuck_gain is not None and gain >= inst.stuck_gain
        return chance, float(inst.params.depth), stuck

    @property
    def reconfig_delay_s(self) -> float:
        return float(self._sim.reconfig_delay_s)

    @property
    def interval_overhead_s(self) -> float:
        return float(self._sim.interval_overhead_s)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimGroundTruth)

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict) -> SimGroundTruth:
        return self

    def __reduce__(self):
        return (type(None), ())  # unpickles as None


def simulator_spec(sim: Simulator, initial_batch: int | None, time_budget_s: float | None) -> BackendSpec:
    """The :class:`BackendSpec` of a simulator: its workers' ranges, the workload's target and budget,
    and an initial local batch (default: the workload's, within each worker's range)."""
    wl = sim.workload
    b0 = wl.initial_local_batch if initial_batch is None else int(initial_batch)
    init = np.full(sim.num_workers, b0, dtype=np.int64)
    if initial_batch is None:
        init = np.clip(init, sim.min_batch, sim.max_batch)
    return BackendSpec(
        gpu_types=sim.gpu_types,
        node_of_worker=tuple(int(x) for x in sim.node_of_worker),
        min_batch=sim.min_batch.copy(),
        max_batch=sim.max_batch.copy(),
        initial_batch=init,
        base_batch=sim.convergence.base_batch,
        target_accuracy=wl.target_quality,
        time_budget_s=wl.time_budget_s if time_budget_s is None else float(time_budget_s),
        num_classes=wl.num_classes,
        workload=wl.name,
        deterministic=True,
        metric=wl.metric,
        lr_rule=sim.convergence.lr_rule,
        compute_curve_s=simulator_compute_curve(sim),
    )


def simulator_compute_curve(sim: Simulator, points: int = COMPUTE_CURVE_POINTS) -> np.ndarray:
    """(N, points) fault-free compute seconds per iteration of each worker at
    :func:`~sim.protocol.compute_curve_batches` (the simulator's :attr:`BackendSpec.compute_curve_s`)."""
    grid = compute_curve_batches(sim.min_batch, sim.max_batch, points)
    # the compute model without fault slow-downs (what a calibration before the run measures)
    return smooth_max(sim._host, sim._gpu_time_s(grid.T), sim._k).T
