"""The simulator: synchronous data-parallel SGD on a heterogeneous cluster, interval by interval.

Discrete happenings (faults switching on and off, restarts) are SimPy events; the arithmetic of the
iterations between two events is vectorised numpy over (iterations x workers). One interval of K
iterations therefore costs a handful of array operations, not K x N SimPy events.

Per iteration j and live worker i (state = the faults active when iteration j starts):

    T_compute[j, i] = smooth_max(host_s[i] * host_slowdown[i],
                                 T_gpu[i](b_i) * gpu_slowdown[i], k[i]) * noise[j, i]
    T_slowest[j]    = max_i T_compute[j, i]                                   # the barrier
    T_sync[j]       = (T_sync(R, nodes) / bandwidth_factor + 2 (R - 1) latency[j]) * jitter[j]
    T_iter[j]       = (T_slowest[j] ** gamma + T_sync[j] ** gamma) ** (1 / gamma)
    idle[j, i]      = T_slowest[j] - T_compute[j, i]

Training progress advances by r(M, p) base-batch steps per iteration at global batch M
(``sim.convergence``); with an instability model (``sim.instability``) a rise of the learning rate
may collapse it. An interval's wall time is its iterations' plus ``reconfig_delay_s`` when a local
batch changed plus a fixed ``interval_overhead_s`` (0 unless a calibrated profile measured it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from sim.cluster import ClusterSpec, get_cluster
from sim.convergence import ConvergenceModel, ConvergenceParams
from sim.faults import ClusterState, FaultInjector, Scenario, get_scenario
from sim.hardware import ComputeParams, smooth_max
from sim.instability import InstabilityModel, InstabilityParams
from sim.measurement import counters
from sim.network import TCP_MSS_BYTES, CommModel
from sim.profile import SHIPPED_MODELS, ClusterProfile, load_profile
from sim.protocol import IntervalReport
from sim.validation import check_int, check_range
from sim.workloads import Workload, get_workload, min_local_batch

log = logging.getLogger(__name__)

#: Host memory a training process holds besides its input batches (framework, CUDA context), GiB.
HOST_BASELINE_GIB = 3.0
#: Batches the input pipeline keeps in flight (PyTorch DataLoader default prefetch of 2 x 1 worker).
PREFETCH_BATCHES = 2


def validation_sd(quality: float, samples: int) -> float:
    """The standard deviation of a validation quality measured on ``samples`` held-out samples
    around its true value ``quality`` (binomial)."""
    return math.sqrt(quality * (1.0 - quality) / samples)


class Simulator:
    """Simulated synchronous data-parallel training of ``workload`` on ``cluster`` under ``scenario``.

    Args:
        cluster: a :class:`ClusterSpec` or a preset name (``sim.cluster.CLUSTERS``); ``None``: the
            profile's cluster, else ``"t4v100"``.
        workload: a :class:`Workload` or a preset name (``sim.workloads.WORKLOADS``); ``None``: the
            profile's workload, else ``"cifar10"``.
        scenario: a :class:`Scenario` or a preset name (``sim.faults.SCENARIOS``).
        seed: seeds the generator used when :meth:`reset` is given neither seed nor generator.
        reconfig_delay_s: pause paid at the start of an interval in which any local batch changed
            (``None``: the profile's, else 1.0).
        min_batch: smallest local batch a worker may run (``None``: the profile's, else the
            workload's ``min_local_batch``, else 16 or the smallest memory cap if lower; see
            :func:`sim.workloads.min_local_batch`).
        lr_rule: overrides the workload's learning-rate scaling rule.
        profile: a calibrated cluster profile (:mod:`sim.profile`: a directory, its
            ``profile.json``, a name under ``sim/data/profiles`` or a loaded ``ClusterProfile``).
            Its fitted compute, communication and convergence models are looked up before the
            shipped ones, and its cluster, workload and overheads are the defaults.
        interval_overhead_s: fixed wall time every interval costs besides its iterations
            (coordination, validation); ``None``: the profile's, else 0.
        compute_params: per GPU type, a :class:`~sim.hardware.ComputeParams` that replaces the
            fitted one (generated worlds: :class:`dynamix_gym.envs.randomized.DomainRandomization`
            draws them around the fitted curves); every key must be a GPU type of the cluster.
        convergence_params: a :class:`~sim.convergence.ConvergenceParams` that replaces the
            workload's fitted convergence model (generated worlds draw a learning-rate limit into it).

    Same seed, same reports, to the bit.
    """

    deterministic = True

    def __init__(
        self,
        cluster: str | ClusterSpec | None = None,
        workload: str | Workload | None = None,
        scenario: str | Scenario = "static_hetero",
        seed: int | None = None,
        *,
        reconfig_delay_s: float | None = None,
        min_batch: int | None = None,
        lr_rule: str | None = None,
        profile: str | Path | ClusterProfile | None = None,
        interval_overhead_s: float | None = None,
        compute_params: Mapping[str, ComputeParams] | None = None,
        convergence_params: ConvergenceParams | None = None,
        instability: InstabilityParams | str | Path | None = None,
    ) -> None:
        prof = load_profile(profile) if profile is not None else None
        self.profile = prof
        #: workers compute on the host CPU (a profile measured without accelerators): their compute
        #: time is CPU time in the utilisation counters
        self.compute_on_host = prof.compute_on_host if prof is not None else False
        models = prof if prof is not None else SHIPPED_MODELS
        if cluster is None:
            cluster = prof.cluster if prof is not None else "t4v100"
        if workload is None:
            workload = prof.workload if prof is not None else "cifar10"
        self.cluster = get_cluster(cluster)
        self.workload = get_workload(workload)
        self.scenario = get_scenario(scenario)
        self.scenario.validate_for(self.cluster.num_workers)
        self.seed = seed
        settings = prof.simulator if prof is not None else {}
        if reconfig_delay_s is None:
            reconfig_delay_s = settings.get("reconfig_delay_s", 1.0)
        if min_batch is None:
            min_batch = settings.get("min_batch")
        if interval_overhead_s is None:
            interval_overhead_s = settings.get("interval_overhead_s", 0.0)
        self.reconfig_delay_s = check_range("reconfig_delay_s", reconfig_delay_s, 0.0, 3600.0)
        self.interval_overhead_s = check_range("interval_overhead_s", interval_overhead_s, 0.0, 3600.0)
        wl = self.workload
        if convergence_params is not None and not isinstance(convergence_params, ConvergenceParams):
            raise ValueError(
                f"convergence_params must be a sim.convergence.ConvergenceParams, got {type(convergence_params).__name__}"
            )
        conv_params = convergence_params or models.convergence_params(wl.convergence)
        self.convergence = ConvergenceModel(conv_params, lr_rule or wl.lr_rule)
        #: collapses at a rise of the learning rate (sim.instability; None: off); the guards ramp it
        self.instability, self.lr_ramped = InstabilityModel.of(instability), False

        n = self.cluster.num_workers
        self.gpu_types = self.cluster.gpu_types
        self.node_of_worker = self.cluster.node_of_worker
        own = dict(compute_params or {})
        unknown = sorted(set(own) - set(self.gpu_types))
        if unknown:
            raise ValueError(
                f"compute_params names GPU types {unknown} that the cluster does not have "
                f"(its types: {sorted(set(self.gpu_types))})"
            )
        for g, cp in own.items():
            if not isinstance(cp, ComputeParams):
                raise ValueError(
                    f"compute_params[{g!r}] must be a sim.hardware.ComputeParams, got {type(cp).__name__}"
                )
        cps = [own[g] if g in own else models.compute_params(g, wl.app) for g in self.gpu_types]
        self._alpha = np.array([p.alpha_s for p in cps]) * wl.flops_scale
        self._beta = np.array([p.beta_s for p in cps]) * wl.flops_scale
        self._exponent = np.array([p.exponent for p in cps])
        self._has_knee = any(p.knee_batch is not None for p in cps)
        self._knee_b = np.array([np.inf if p.knee_batch is None else p.knee_batch for p in cps])
        self._knee_beta = np.array([p.knee_beta_s for p in cps]) * wl.flops_scale
        self._host = np.array([p.host_s for p in cps])
        self._k = np.array([p.k for p in cps])
        self.max_batch = np.array([p.max_batch for p in cps], dtype=np.int64)
        if min_batch is None:
            min_batch = min_local_batch(wl, self.max_batch)
        self.min_batch_value = check_int("min_batch", min_batch, 1)
        self.min_batch = np.full(n, self.min_batch_value, dtype=np.int64)
        if np.any(self.min_batch > self.max_batch):
            raise ValueError(
                f"min_batch ({self.min_batch_value}) exceeds the memory cap of some workers "
                f"({dict(zip(self.gpu_types, self.max_batch.tolist(), strict=True))}); allowed: "
                f"[1, {int(self.max_batch.min())}]"
            )
        self._comm_params = [models.comm_params(g, wl.app) for g in sorted(set(self.gpu_types))]
        self._comm_cache: dict[tuple[int, int], CommModel] = {}
        # Device memory: weights, gradients and two optimiser moments (4 x model), the rest
        # activations, sized so that the measured memory cap fills 90% of the device.
        gpu_mem = np.array([models.gpu_memory_gib(g) for g in self.gpu_types]) * 2**30
        self._gpu_mem_fixed = 4.0 * wl.model_bytes / gpu_mem
        self._gpu_mem_per_sample = np.maximum(0.9 - self._gpu_mem_fixed, 0.0) / self.max_batch
        host_mem = np.array([self.cluster.nodes[i].host_mem_gib for i in self.node_of_worker])
        host_mem_per_worker = host_mem / np.array([self.cluster.nodes[i].gpus for i in self.node_of_worker])
        self._host_mem_fixed = HOST_BASELINE_GIB / host_mem_per_worker
        self._host_mem_per_sample = wl.sample_bytes * PREFETCH_BATCHES / (host_mem_per_worker * 2**30)
        self._rng: np.random.Generator | None = None
        self._env: simpy.Environment | None = None
        self.progress_scale = 1.0  #: on progress per iteration (an lr multiplier's effect, sim.elastic)

    # --- properties -------------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return self.cluster.num_workers

    @property
    def now_s(self) -> float:
        self._require_reset()
        return self._t

    @property
    def progress(self) -> float:
        self._require_reset()
        return self._progress

    @property
    def noise_progress(self) -> float:
        """The gradient statistics' counter (equal to :attr:`progress` unless the convergence model's
        noise is split: ``sim.convergence``)."""
        self._require_reset()
        return self._noise_progress

    @property
    def batch_memory_log2(self) -> float | None:
        """The accuracy model's batch memory (EMA of log2 of the global batch; None before the first
        interval)."""
        self._require_reset()
        return self._batch_memory

    @property
    def fault_log(self):
        self._require_reset()
        return list(self._state.log)

    # --- lifecycle --------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """Start a fresh run at time 0. ``rng`` (if given) drives every draw; else ``seed``; else the
        constructor's seed.

        Two child streams are spawned from it: one for the fault processes, one for per-interval
        noise. Faults therefore unfold identically whatever batches a controller chooses (same
        seed, same throttling windows and congestion), which keeps comparisons between
        controllers fair.
        """
        if rng is None:
            rng = np.random.default_rng(self.seed if seed is None else seed)
        fault_rng, self._rng = rng.spawn(2)
        if self.instability is not None:  # a stream of its own, after the others: they stay as they were
            self.instability.reset(rng.spawn(1)[0])
        self._env = simpy.Environment()
        n = self.num_workers
        speed = np.asarray(self.scenario.worker_speed or np.ones(n), dtype=np.float64)
        self._state = ClusterState(n, speed)
        self._faults = FaultInjector(
            self._env, self._state, self.scenario, self.gpu_types, self.node_of_worker, fault_rng
        )
        self._t = 0.0
        self._progress = 0.0
        self._noise_progress = 0.0  # the gradient statistics' counter (sim.convergence: q)
        self._samples = 0
        self._batch_memory: float | None = None
        self._last_batches: np.ndarray | None = None
        self._log_cursor = 0

    def close(self) -> None:
        self._env = None

    def training_state(self) -> tuple[float, float | None, float]:
        """The model's progress, batch memory and noise counter: what the guards' rollback puts back
        (sim.guards)."""
        return self._progress, self._batch_memory, self._noise_progress

    def load_training_state(self, state: tuple[float, float | None, float]) -> None:
        self._progress, self._batch_memory, self._noise_progress = state

    # --- elastic worker sets (sim.elastic) ----------------------------------------------------------
    def set_workers(self, held, restart_delay_s: float) -> bool:
        """Hold exactly the workers where ``held`` is true from now on; the others leave the group.

        A changed set costs an elastic restart of ``restart_delay_s`` (re-forming the process group
        and reloading the checkpoint), paid before the next iteration as a lost worker's is. Returns
        whether the set changed. Without a call every worker is held, as before.
        """
        self._require_reset()
        mask = np.asarray(held)
        n = self.num_workers
        if mask.shape != (n,) or mask.dtype != bool:
            raise ValueError(f"held must be a boolean array of shape ({n},), got {mask.dtype} {mask.shape}")
        if not mask.any():
            raise ValueError("held must keep at least one worker (a worker count below one)")
        delay = check_range("restart_delay_s", restart_delay_s, 0.0, 1e5)
        st = self._state
        if np.array_equal(mask, st.held):
            return False
        st.set_held(mask)
        st.pending_delay_s += delay
        return True

    @property
    def held(self) -> np.ndarray:
        self._require_reset()
        return self._state.held.copy()

    def start_process(self, generator) -> None:
        """Run a SimPy process (a generator of events) on this run's clock; its events split the
        intervals like fault events do."""
        self._require_reset()
        self._env.process(generator)

    @property
    def clock(self) -> simpy.Environment:
        """This run's SimPy environment (for processes started with :meth:`start_process`)."""
        self._require_reset()
        return self._env

    @property
    def state(self) -> ClusterState:
        self._require_reset()
        return self._state

    def _require_reset(self) -> None:
        if self._env is None:
            raise RuntimeError("Simulator.reset() must be called before running intervals")

    # --- models -----------------------------------------------------------------------------------
    def _comm(self, replicas: int, nodes: int) -> CommModel:
        key = (replicas, nodes)
        if key not in self._comm_cache:
            wl = self.workload
            self._comm_cache[key] = CommModel(
                self._comm_params, replicas, nodes, wl.model_bytes, size_scale=wl.comm_scale
            )
        return self._comm_cache[key]

    def _gpu_time_s(self, b: np.ndarray) -> np.ndarray:
        # T_gpu(b) = alpha + beta * b ** exponent [+ knee_beta * max(0, b - knee)]  (per worker, FLOP-scaled)
        t = self._alpha + self._beta * b**self._exponent
        if self._has_knee:
            t = t + self._knee_beta * np.maximum(0.0, b - self._knee_b)
        return t

    def compute_extras(self) -> dict[str, list[float]]:
        """The compute-model terms beyond alpha, beta and the exponent that are in use (none: {})."""
        if not self._has_knee:
            return {}
        return {"knee_batch": self._knee_b.tolist(), "knee_beta_s": self._knee_beta.tolist()}

    def compute_time_s(self, local_batches: np.ndarray) -> np.ndarray:
        """Noise-free compute time per worker at the current fault state (ground truth)."""
        self._require_reset()
        st = self._state
        b = np.asarray(local_batches, dtype=np.float64)
        return smooth_max(self._host * st.host_slowdown, self._gpu_time_s(b) * st.gpu_slowdown, self._k)

    def iteration_time_s(self, local_batches: np.ndarray) -> float:
        """Noise-free iteration time at the current fault state (ground truth)."""
        st = self._state
        alive = st.alive
        comp = self.compute_time_s(local_batches)[alive]
        r = int(alive.sum())
        comm = self._comm(r, self._nodes_alive(alive))
        sync = comm.sync_time_s(st.bandwidth_factor, self.scenario.network.latency_jitter_s)
        return float(comm.iteration_time_s(comp.max(), sync))

    def _nodes_alive(self, alive: np.ndarray) -> int:
        return len(np.unique(self.node_of_worker[alive]))

    # --- validation -------------------------------------------------------------------------------
    def _check_batches(self, local_batches) -> np.ndarray:
        b = np.asarray(local_batches)
        n = self.num_workers
        if b.shape != (n,):
            raise ValueError(f"local_batches must have shape ({n},), got {b.shape}")
        if not np.issubdtype(b.dtype, np.integer):
            if (
                not np.issubdtype(b.dtype, np.floating)
                or not np.all(np.isfinite(b))
                or np.any(b != np.round(b))
            ):
                raise ValueError(f"local_batches must be whole numbers, got {b.tolist()}")
        b = b.astype(np.int64)
        bad = np.flatnonzero((b < self.min_batch) | (b > self.max_batch))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"local_batches[{i}] = {int(b[i])} is outside worker {i}'s allowed range "
                f"[{int(self.min_batch[i])}, {int(self.max_batch[i])}] ({self.gpu_types[i]})"
            )
        return b

    # --- the interval -----------------------------------------------------------------------------
    def _advance_events(self, until: float) -> None:
        """Process every fault event scheduled at or before ``until``."""
        env = self._env
        while env.peek() <= until:
            env.step()

    def run_interval(self, local_batches, iterations: int = 50) -> IntervalReport:
        """Run ``iterations`` synchronous iterations at ``local_batches`` and report what was measured."""
        self._require_reset()
        k_iters = check_int("iterations (K)", iterations, 1, 1_000_000)
        b = self._check_batches(local_batches)
        rng, st, sc, conv = self._rng, self._state, self.scenario, self.convergence
        n = self.num_workers
        t_start = self._t

        # Every random draw of the interval, in a fixed order, so that the stream does not depend
        # on where fault events fall.
        cv = sc.compute_noise_cv
        compute_noise = np.exp(cv * rng.standard_normal((k_iters, n)) - 0.5 * cv**2)
        cv = sc.network.bandwidth_cv
        sync_jitter = np.exp(cv * rng.standard_normal(k_iters) - 0.5 * cv**2)
        latency = rng.exponential(1.0, k_iters) * sc.network.latency_jitter_s
        noise = _Draws(
            grad=conv.grad_noise(rng, b, k_iters + 1),
            meas=np.exp(sc.measurement_noise_cv * rng.standard_normal((5, n))),
            normal=rng.standard_normal(n + 1),
        )

        # Reconfiguration pause when any batch changed.
        reconfig = 0.0
        if self._last_batches is not None and np.any(b != self._last_batches):
            reconfig = self.reconfig_delay_s
        self._last_batches = b
        if self._batch_memory is None:
            self._batch_memory = conv.initial_batch_memory(float(b.sum()))
        t = t_start + reconfig + self.interval_overhead_s
        self._advance_events(t)
        if self.instability is not None:  # a collapse at a rise of the learning rate
            gb0 = int(b[st.alive].sum()) or int(b.sum())
            kept = self.instability.interval(gb0, conv, self._noise_progress, self.lr_ramped)
            self._progress *= kept
            self._noise_progress *= kept

        acc = _Sums(n)
        j = 0
        while j < k_iters:
            if st.pending_delay_s > 0:  # elastic restart after a worker was lost or came back
                acc.stall += st.pending_delay_s
                t += st.pending_delay_s
                st.pending_delay_s = 0.0
                self._advance_events(t)
                continue
            alive = st.alive
            if not alive.any():
                raise RuntimeError("every worker is lost: the scenario leaves no worker to train on")
            replicas = int(alive.sum())
            comm = self._comm(replicas, self._nodes_alive(alive))
            gpu_t = self._gpu_time_s(b) * st.gpu_slowdown
            host_t = self._host * st.host_slowdown
            comp = np.where(alive, smooth_max(host_t, gpu_t, self._k) * compute_noise[j:], 0.0)
            slowest = comp.max(axis=1)
            if replicas > 1:
                ring_latency = 2 * (replicas - 1) * latency[j:]
                sync = (comm.base_sync_s / st.bandwidth_factor + ring_latency) * sync_jitter[j:]
            else:
                sync = np.zeros_like(slowest)
            it = comm.iteration_time_s(slowest, sync)
            t_event = self._env.peek()
            m = len(it)
            if not math.isinf(t_event):  # iterations that start before the next fault event
                starts = t + np.concatenate(([0.0], np.cumsum(it[:-1])))
                m = int(np.searchsorted(starts, t_event, side="left"))
            if m > 0:
                seg_time = float(it[:m].sum())
                acc.compute += comp[:m].sum(axis=0)
                acc.idle += np.where(alive, (slowest[:m, None] - comp[:m]).sum(axis=0), 0.0)
                acc.gpu_busy += np.where(alive, gpu_t * m, 0.0)
                acc.host_busy += np.where(alive, host_t * m, 0.0)
                acc.cpu_load += st.cpu_load * seg_time
                acc.iters_alive += alive * m
                acc.iter_time += seg_time
                acc.comm += float((it[:m] - slowest[:m]).sum())
                seg_bytes = np.where(alive, comm.bytes_per_iteration * m, 0.0)
                acc.bytes_sent += seg_bytes
                if comm.nodes > 1:  # inter-node traffic rides on TCP
                    loss = sc.network.loss_rate + st.congestion_loss_rate
                    acc.retrans_expected += seg_bytes / TCP_MSS_BYTES * loss
                gb = int(b[alive].sum())
                acc.global_batch = gb
                # Progress over the segment, midpoint rule in progress.
                dp, dq = conv.advance(gb, self._progress, self._noise_progress, m)
                if self.progress_scale != 1.0:
                    dp *= self.progress_scale
                    dq *= self.progress_scale
                if self.instability is not None and self.instability.stuck:
                    dp = dq = 0.0  # collapsed, and the rate that collapsed it still stands
                self._batch_memory = conv.update_batch_memory(self._batch_memory, gb, dp)
                self._progress += dp
                self._noise_progress += dq
                acc.samples += gb * m
                t += seg_time
                j += m
            if j < k_iters:
                self._advance_events(t)
        if t > self._env.now:
            self._env.run(until=t)
        self._t = t
        self._samples += acc.samples
        return self._measure(b, k_iters, t - t_start, reconfig, acc, noise)

    def _measure(
        self, b: np.ndarray, k_iters: int, interval_time: float, reconfig: float, acc: _Sums, noise: _Draws
    ) -> IntervalReport:
        rng, st, conv, wl = self._rng, self._state, self.convergence, self.workload
        measured = counters(
            acc,
            b,
            k_iters,
            interval_time,
            noise.meas,
            compute_on_host=self.compute_on_host,
            host_mem=(self._host_mem_fixed, self._host_mem_per_sample),
            gpu_mem=(self._gpu_mem_fixed, self._gpu_mem_per_sample),
        )
        took_part = measured["alive"]
        retrans = rng.poisson(acc.retrans_expected).astype(np.float64)

        # Accuracy of training batches (binomial noise over the samples seen) and on validation.
        progress, memory = self._progress, self._batch_memory
        acc_train = conv.train_accuracy(progress, memory)
        n_seen = np.maximum(b * acc.iters_alive, 1.0)
        sd_train = np.sqrt(acc_train * (1.0 - acc_train) / n_seen)
        batch_acc = np.where(took_part, np.clip(acc_train + sd_train * noise.normal[:-1], 0.0, 1.0), 0.0)
        acc_val = conv.accuracy(progress, memory)
        sd_val = validation_sd(acc_val, wl.val_samples)
        val_acc = float(np.clip(acc_val + sd_val * noise.normal[-1], 0.0, 1.0))
        batch_loss = np.where(took_part, loss_from_accuracy(batch_acc, wl.num_classes), 0.0)

        # Gradient statistics: E|g_b|^2 = |G|^2 + tr(Sigma) / b, with tr(Sigma) = M0 * grad_var.
        q = self._noise_progress
        g2, v = conv.grad_stats(q)
        m0 = conv.base_batch
        sq = (g2 + v * m0 / b) * noise.grad[:k_iters]
        norms = np.sqrt(sq)
        gb = max(acc.global_batch, 1)
        global_sqr = float((g2 + v * m0 / gb) * conv.global_grad_factor(noise.grad))

        new_events = st.log[self._log_cursor :]
        self._log_cursor = len(st.log)
        truth = {
            "progress": progress,
            "noise_scale": conv.noise_scale(q),
            "efficiency": conv.efficiency(gb, q),
            "grad_sqr": g2,
            "grad_var": v,
            "val_accuracy": acc_val,
            "batch_memory_log2": memory,
            "speed": st.speed.copy(),
            "gpu_slowdown": st.gpu_slowdown.copy(),
            "host_slowdown": st.host_slowdown.copy(),
            "bandwidth_factor": st.bandwidth_factor,
            "alive": st.alive.copy(),
            "stall_s": acc.stall,
        }  # plain values; the noise-free models are asked through the backend's ground_truth handle
        return IntervalReport(
            local_batch=b.copy(),
            **measured,
            tcp_retransmissions=retrans,
            batch_accuracy=batch_acc,
            batch_loss=batch_loss,
            grad_norm_mean=np.where(took_part, norms.mean(axis=0), 0.0),
            grad_norm_var=np.where(took_part, norms.var(axis=0), 0.0),
            local_grad_sqr=np.where(took_part, sq.mean(axis=0), 0.0),
            iterations=k_iters,
            interval_time_s=interval_time,
            wall_time_s=self._t,
            reconfig_time_s=reconfig,
            comm_time_s=acc.comm / k_iters,
            global_batch=acc.global_batch,
            global_grad_sqr=global_sqr,
            val_accuracy=val_acc,
            val_loss=float(loss_from_accuracy(val_acc, wl.num_classes)),
            samples=acc.samples,
            epoch=self._samples / wl.samples_per_epoch,
            events=tuple(str(e) for e in new_events),
            truth=truth,
        )


class _Sums:
    """Running sums over the iterations of one interval."""

    def __init__(self, n: int) -> None:
        self.compute, self.idle, self.gpu_busy, self.host_busy = (np.zeros(n) for _ in range(4))
        self.cpu_load, self.iters_alive, self.retrans_expected, self.bytes_sent = (
            np.zeros(n) for _ in range(4)
        )
        self.iter_time, self.comm, self.stall = 0.0, 0.0, 0.0
        self.samples, self.global_batch = 0, 0


@dataclass(frozen=True)
class _Draws:
    """Pre-drawn noise of one interval."""

    grad: np.ndarray  # (K + 1, N) gamma factors of |g|^2 (last row: the all-reduced gradient)
    meas: np.ndarray  # (5, N) log-normal measurement noise of counters
    normal: np.ndarray  # (N + 1,) standard normals: batch accuracies, then validation accuracy


def loss_from_accuracy(acc: np.ndarray | float, num_classes: int) -> np.ndarray:
    """Cross-entropy proxy: ln(C) at chance accuracy, falling linearly to 0 at accuracy 1."""
    chance = 1.0 / num_classes
    frac_wrong = np.clip((1.0 - np.asarray(acc, dtype=np.float64)) / (1.0 - chance), 0.0, None)
    return math.log(num_classes) * frac_wrong
