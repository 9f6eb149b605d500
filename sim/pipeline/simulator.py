"""Pipeline-parallel training on a simulated cluster, interval by interval, under the fault scenarios.

The cluster's workers are cut into S contiguous groups, one per stage (``num_workers / S``
replicas each, splitting each micro-batch). Faults are the scenarios of :mod:`sim.faults` (the same
SimPy processes and :class:`~sim.faults.ClusterState` as the data-parallel engine) and hit the
workers, hence the stages that hold them. Between two fault events, per stage s with live replicas
R_s, for iteration j:

    c_f[s], c_b[s]  = max over live replicas r of stage_compute_s(gpu_r, blocks of s, mb / R_s)
                      * gpu_slowdown[r]                             # sim.pipeline.model
    x_f[s]          = p2p(output of s's last block * mb / R_s)  to s + 1   # activations (s < S - 1)
    x_b[s]          = p2p(output of the block before s * mb / R_s) to s - 1 # gradients (s > 0)
    f[j, s]         = c_f[s] * eps[j, s] + x_f[s] * eta[j];  b[j, s] likewise
                      eps ~ LogNormal(compute_noise_cv), eta ~ LogNormal(bandwidth_cv) per iteration
    T_sync[j]       = sum_s n_f[s] f[j, s] + n_b[s] b[j, s] + A      # the mean schedule's critical path
                      (sim.pipeline.schedule: exact at the mean times; first order in the noise)
                      A = max_s ring all-reduce of stage s's parameters over its R_s replicas
    T_async[j]      = M * max_s (f[j, s] + b[j, s] + A_s)            # steady state; the first
                      iteration after a (re)start pays the 1F1B fill and drain

A stage without a live worker stalls the pipeline until one returns; a worker's loss or return
costs the scenario's restart delay. A re-partition pays its moved blocks' state (parameters and
optimiser) over the links between their old and new stages (links in parallel) plus a fixed pause
``repartition_pause_s``. Progress: synchronous schedules take one step per iteration at global batch
M * mb (:mod:`sim.convergence`); async 1F1B one update per micro-batch at mb, each worth
1 / phi(S) (:mod:`sim.pipeline.staleness`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache

import numpy as np
import simpy

from sim.cluster import ClusterSpec, get_cluster
from sim.convergence import ConvergenceModel, convergence_params
from sim.datafiles import data_path
from sim.engine import validation_sd
from sim.faults import ClusterState, FaultInjector, Scenario, get_scenario
from sim.hardware import GPU_MEMORY_GIB
from sim.pipeline.links import link_bandwidth_bytes_per_s, p2p_time_s
from sim.pipeline.model import PipelineModel
from sim.pipeline.partition import (
    GIB,
    bounds,
    check_memory,
    check_sizes,
    even_split,
    placement,
    stage_memory_bytes,
)
from sim.pipeline.report import PipelineReport
from sim.pipeline.schedule import SCHEDULES, iteration_time_s, steady_period_s
from sim.pipeline.staleness import DEFAULT_KAPPA, staleness_penalty
from sim.scaling import advance
from sim.validation import check_choice, check_int, check_range

#: Measured pause of a real re-partition (``python -m experiments.pipeline_pause``: two CPU gloo
#: stage ranks stopped at a step boundary, each block's state saved by name, re-split, restarted).
PAUSE_FILE = "pipeline_pause.json"


@cache
def measured_repartition_pause_s() -> float:
    """The median pause of the shipped measurement (``sim/data/pipeline_pause.json``)."""
    return float(json.loads(data_path(PAUSE_FILE).read_text())["repartition_pause_s"])


_CACHE_LIMIT = 256


class PipelineSimulator:
    """Simulated pipeline-parallel training of ``model`` on ``cluster`` under ``scenario``.

    Args:
        cluster: a :class:`ClusterSpec` or preset name.
        model: the :class:`~sim.pipeline.model.PipelineModel` (its workload sets the convergence).
        scenario: a :class:`~sim.faults.Scenario` or preset name.
        stages: S (must divide the workers; ``None``: one stage per worker).
        schedule: one of :data:`~sim.pipeline.schedule.SCHEDULES`.
        seed: seeds :meth:`reset` when it gets neither seed nor generator.
        staleness_kappa: kappa of :func:`~sim.pipeline.staleness.staleness_penalty`.
        repartition_pause_s: the fixed part of a re-partition's cost (``None``: the measured one,
            :func:`measured_repartition_pause_s`).
        memory_gib: per worker device memory (``None``: the GPU type's, ``sim.hardware.GPU_MEMORY_GIB``).
        link: ``(bandwidth bytes/s, latency s)`` of every point-to-point link and of the replicas'
            ring all-reduce, replacing the fitted GPU links (``None``: :mod:`sim.pipeline.links`);
            a measured backend's fit (``experiments.pipeline_fidelity``).
    """

    def __init__(
        self,
        cluster: str | ClusterSpec,
        model: PipelineModel,
        scenario: str | Scenario = "static_hetero",
        *,
        stages: int | None = None,
        schedule: str = "1f1b",
        seed: int | None = None,
        staleness_kappa: float = DEFAULT_KAPPA,
        repartition_pause_s: float | None = None,
        memory_gib: Sequence[float] | None = None,
        link: tuple[float, float] | None = None,
    ) -> None:
        self.cluster = get_cluster(cluster)
        self.model = model
        self.scenario = get_scenario(scenario)
        n = self.cluster.num_workers
        self.scenario.validate_for(n)
        self.num_stages = check_int("stages", stages if stages is not None else n, 1, model.num_blocks)
        self.stage_workers = placement(n, self.num_stages)
        self.schedule = check_choice("schedule", schedule, SCHEDULES)
        self.seed = seed
        self.kappa = check_range("staleness_kappa", staleness_kappa, 0.0, 10.0)
        self.phi = staleness_penalty(self.num_stages, self.kappa) if schedule == "async_1f1b" else 1.0
        if repartition_pause_s is None:
            repartition_pause_s = measured_repartition_pause_s()
        self.repartition_pause_s = check_range("repartition_pause_s", repartition_pause_s, 0.0, 1e5)
        if link is not None:
            link = (check_range("link[0] (bytes/s)", link[0], 0.0, low_open=True),
                    check_range("link[1] (latency s)", link[1], 0.0, 10.0))  # fmt: skip
        self.link = link
        self.gpu_types = self.cluster.gpu_types
        self.node_of_worker = self.cluster.node_of_worker
        mem = [GPU_MEMORY_GIB[g] for g in self.gpu_types] if memory_gib is None else list(memory_gib)
        if len(mem) != n:
            raise ValueError(f"memory_gib has {len(mem)} entries, the cluster has {n} workers")
        self.memory_bytes = (
            np.array([check_range(f"memory_gib[{i}]", m, 0.0, low_open=True) for i, m in enumerate(mem)])
            * GIB
        )
        self.stage_cap_bytes = np.array([self.memory_bytes[list(w)].min() for w in self.stage_workers])
        self.convergence = ConvergenceModel(
            convergence_params(model.workload.convergence), model.workload.lr_rule
        )
        self.target_quality = model.workload.target_quality
        self._times: dict[tuple, tuple] = {}
        self._env: simpy.Environment | None = None

    # --- state -------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """A fresh run: time 0, no progress, the scenario's fault processes started from one seed."""
        if rng is None:
            rng = np.random.default_rng(self.seed if seed is None else seed)
        fault_rng, self._rng = rng.spawn(2)  # faults do not depend on the controller's choices
        self._env = simpy.Environment()
        speed = np.asarray(self.scenario.worker_speed or np.ones(self.cluster.num_workers), dtype=np.float64)
        self._state = ClusterState(self.cluster.num_workers, speed)
        FaultInjector(self._env, self._state, self.scenario, self.gpu_types, self.node_of_worker, fault_rng)
        self._t = 0.0
        self._progress = 0.0
        self._memory: float | None = None
        self._samples = 0
        self._sizes: tuple[int, ...] | None = None
        self._needs_fill = True
        self._log_cursor = 0

    @property
    def wall_time_s(self) -> float:
        return self._t

    @property
    def progress(self) -> float:
        return self._progress

    def default_sizes(self) -> tuple[int, ...]:
        return even_split(self.model.num_blocks, self.num_stages)

    def replicas(self, alive: np.ndarray | None = None) -> list[int]:
        alive = self._state.alive if alive is None else alive
        return [int(alive[list(w)].sum()) for w in self.stage_workers]

    def memory_check(self, sizes: Sequence[int], micro_batches: int) -> np.ndarray:
        """Stage memory (bytes) of a plan; :class:`~sim.pipeline.partition.PipelineMemoryError` if over a cap."""
        sizes = check_sizes(sizes, self.model.num_blocks)
        self._check_stages(sizes)
        reps = [len(w) for w in self.stage_workers]
        return check_memory(self.model, sizes, self.schedule, micro_batches, reps, self.stage_cap_bytes)

    def stage_memory(self, sizes: Sequence[int], micro_batches: int) -> np.ndarray:
        reps = [len(w) for w in self.stage_workers]
        return stage_memory_bytes(self.model, sizes, self.schedule, micro_batches, reps)

    def _check_stages(self, sizes: tuple[int, ...]) -> None:
        if len(sizes) != self.num_stages:
            raise ValueError(f"the partition has {len(sizes)} stages, the pipeline {self.num_stages}")

    # --- the time model ----------------------------------------------------------------------------
    def stage_times(
        self, sizes: Sequence[int], micro_batches: int, slowdown: np.ndarray | None = None,
        alive: np.ndarray | None = None, bandwidth_factor: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """Noise-free (compute f, compute b, send f, send b, all-reduce) per stage at a fault state
        (default: the current one). Stages without a live worker get ``inf``."""
        if slowdown is None or alive is None or bandwidth_factor is None:
            if self._env is None:
                raise RuntimeError(
                    "stage_times() of the current state needs reset() first (or pass the state)"
                )
            st = self._state
            slowdown = st.gpu_slowdown if slowdown is None else slowdown
            alive = st.alive if alive is None else alive
            bandwidth_factor = st.bandwidth_factor if bandwidth_factor is None else bandwidth_factor
        slow, bw = np.asarray(slowdown, dtype=np.float64), float(bandwidth_factor)
        alive = np.asarray(alive, dtype=bool)
        key = (tuple(sizes), micro_batches, slow.tobytes(), alive.tobytes(), bw)
        hit = self._times.get(key)
        if hit is not None:
            return hit
        m, b = self.model, bounds(sizes)
        S = len(sizes)
        cf, cb, xf, xb, ar = (np.zeros(S) for _ in range(5))
        for s, workers in enumerate(self.stage_workers):
            live = [w for w in workers if alive[w]]
            if not live:
                cf[s] = cb[s] = math.inf
                continue
            share = m.micro_batch / len(live)
            times = [m.stage_compute_s(self.gpu_types[w], b[s], b[s + 1], share) for w in live]
            cf[s] = max(t[0] * slow[w] for t, w in zip(times, live, strict=True))
            cb[s] = max(t[1] * slow[w] for t, w in zip(times, live, strict=True))
            w0 = live[0]
            if s < S - 1:
                nxt = self._first_live(s + 1, alive)
                xf[s] = self.p2p_s(m.output_bytes(b[s + 1] - 1) * share, w0, nxt, bw)
            if s > 0:
                prv = self._first_live(s - 1, alive)
                xb[s] = self.p2p_s(m.output_bytes(b[s] - 1) * share, w0, prv, bw)
            if len(live) > 1:  # ring all-reduce of the stage's gradient among its replicas
                nbytes = 2.0 * (len(live) - 1) / len(live) * m.param_bytes(b[s], b[s + 1])
                inter = len({int(self.node_of_worker[w]) for w in live}) > 1
                gpus = {self.gpu_types[w] for w in live}
                bw_ring = (
                    self.link[0] if self.link else min(link_bandwidth_bytes_per_s(g, inter) for g in gpus)
                ) * bw
                ar[s] = nbytes / bw_ring
        out = (cf, cb, xf, xb, ar)
        if len(self._times) > _CACHE_LIMIT:
            self._times.clear()
        self._times[key] = out
        return out

    def _first_live(self, stage: int, alive: np.ndarray) -> int:
        live = [w for w in self.stage_workers[stage] if alive[w]]
        return live[0] if live else self.stage_workers[stage][0]

    def p2p_s(self, nbytes: float, a: int, b: int, bandwidth_factor: float = 1.0) -> float:
        """Seconds to send ``nbytes`` from worker ``a`` to worker ``b`` (0 bytes: 0 s)."""
        if self.link is not None:
            return nbytes / (self.link[0] * bandwidth_factor) + self.link[1] if nbytes > 0 else 0.0
        inter = bool(self.node_of_worker[a] != self.node_of_worker[b])
        return p2p_time_s(nbytes, self.gpu_types[a], self.gpu_types[b], inter, bandwidth_factor)

    def expected_iteration_time_s(self, sizes: Sequence[int], micro_batches: int, **state) -> float:
        """Noise-free steady-state iteration time of a plan at a fault state (default: the current)."""
        cf, cb, xf, xb, ar = self.stage_times(tuple(sizes), micro_batches, **state)
        if not np.all(np.isfinite(cf)):
            return math.inf
        f, b = cf + xf, cb + xb
        if self.schedule == "async_1f1b":
            return micro_batches * steady_period_s(f, b + ar)
        return iteration_time_s(self.schedule, f, b, micro_batches)[0] + float(ar.max())

    def _critical(self, f: np.ndarray, b: np.ndarray, micro_batches: int) -> tuple[float, np.ndarray]:
        key = ("crit", self.schedule, f.tobytes(), b.tobytes(), micro_batches)
        hit = self._times.get(key)
        if hit is None:
            kind = "1f1b" if self.schedule == "async_1f1b" else self.schedule
            hit = iteration_time_s(kind, f, b, micro_batches)
            self._times[key] = hit
        return hit

    def repartition_cost_s(self, old: Sequence[int], new: Sequence[int]) -> float:
        """Moving the blocks whose stage changes: per link, their state's bytes at its bandwidth (links
        in parallel), plus the fixed pause; 0 when nothing moves."""
        if tuple(old) == tuple(new):
            return 0.0
        owner_old = np.repeat(np.arange(len(old)), old)
        owner_new = np.repeat(np.arange(len(new)), new)
        per_link: dict[tuple[int, int], float] = {}
        for blk in np.flatnonzero(owner_old != owner_new):
            pair = (int(owner_old[blk]), int(owner_new[blk]))
            per_link[pair] = per_link.get(pair, 0.0) + self.model.state_bytes(blk, blk + 1)
        bw = self._state.bandwidth_factor
        move = max(
            self.p2p_s(n, self._first_live(a, self._state.alive), self._first_live(c, self._state.alive), bw)
            for (a, c), n in per_link.items()
        )
        return move + self.repartition_pause_s

    # --- one interval ------------------------------------------------------------------------------
    def run_interval(self, sizes: Sequence[int], micro_batches: int, iterations: int = 10) -> PipelineReport:
        """Run ``iterations`` iterations of ``micro_batches`` micro-batches on partition ``sizes``."""
        if self._env is None:
            raise RuntimeError("call reset() before run_interval()")
        sizes = check_sizes(sizes, self.model.num_blocks)
        self._check_stages(sizes)
        M = check_int("micro_batches", micro_batches, 1, 4096)
        K = check_int("iterations", iterations, 1, 1_000_000)
        key = ("memory", sizes, M)
        mem = self._times.get(key)
        if mem is None:
            mem = self._times[key] = self.memory_check(sizes, M)
        rng, st, sc, conv, S = self._rng, self._state, self.scenario, self.convergence, self.num_stages
        eps = np.exp(sc.compute_noise_cv * rng.standard_normal((K, S)) - 0.5 * sc.compute_noise_cv**2)
        cv = sc.network.bandwidth_cv
        eta = np.exp(cv * rng.standard_normal(K) - 0.5 * cv**2)
        meas = np.exp(sc.measurement_noise_cv * rng.standard_normal((3, S)))
        val_normal = float(rng.standard_normal())

        t_start = t = self._t
        repart = 0.0
        if self._sizes is not None and sizes != self._sizes:
            repart = self.repartition_cost_s(self._sizes, sizes)
            self._needs_fill = True
        self._sizes = sizes
        t += repart
        self._advance(t)
        gb = M * self.model.micro_batch if self.schedule != "async_1f1b" else self.model.micro_batch
        if self._memory is None:
            self._memory = conv.initial_batch_memory(gb)
        busy = np.zeros(S)
        sum_cf, sum_cb, sum_x, sent = np.zeros(S), np.zeros(S), np.zeros(S), np.zeros(max(S - 1, 0))
        iter_time = stall = 0.0
        j = 0
        while j < K:
            if st.pending_delay_s > 0:  # a worker lost or back: the job restarts
                stall += st.pending_delay_s
                t += st.pending_delay_s
                st.pending_delay_s = 0.0
                self._needs_fill = True
                self._advance(t)
                continue
            cf, cb, xf, xb, ar = self.stage_times(sizes, M)
            if not np.all(np.isfinite(cf)):  # a stage has no live worker: wait for the next event
                nxt = self._env.peek()
                if math.isinf(nxt):
                    raise RuntimeError("a pipeline stage lost every worker for good: the run cannot go on")
                stall += nxt - t
                t = nxt
                self._needs_fill = True
                self._advance(t)
                continue
            f = cf[None, :] * eps[j:] + xf[None, :] * eta[j:, None]
            b = cb[None, :] * eps[j:] + xb[None, :] * eta[j:, None]
            if self.schedule == "async_1f1b":
                it = M * np.max(f + b + ar[None, :], axis=1)
                if self._needs_fill:  # fill and drain once after a (re)start
                    it[0] = max(it[0], self._critical(cf + xf, cb + xb + ar, M)[0])
                    self._needs_fill = False
            else:
                _, counts = self._critical(cf + xf, cb + xb, M)
                it = (f * counts[:, 0]).sum(axis=1) + (b * counts[:, 1]).sum(axis=1) + ar.max()
            m = len(it)
            t_event = self._env.peek()
            if not math.isinf(t_event):
                starts = t + np.concatenate(([0.0], np.cumsum(it[:-1])))
                m = max(int(np.searchsorted(starts, t_event, side="left")), 0)
            if m > 0:
                seg = float(it[:m].sum())
                busy += M * (cf * eps[j : j + m].sum(axis=0) + cb * eps[j : j + m].sum(axis=0))
                sum_cf += cf * eps[j : j + m].sum(axis=0)
                sum_cb += cb * eps[j : j + m].sum(axis=0)
                sum_x += (xf + xb) * m
                if S > 1:
                    out = np.array([self.model.output_bytes(x - 1) for x in bounds(sizes)[1:-1]])
                    sent += 2.0 * out * self.model.micro_batch * M * m  # activations down, gradients up
                self._step(gb, m if self.schedule != "async_1f1b" else m * M)
                iter_time += seg
                t += seg
                j += m
            if j < K:
                self._advance(t)
        if t > self._env.now:
            self._env.run(until=t)
        self._t = t
        interval = t - t_start
        return self._report(sizes, M, K, interval, iter_time, repart, stall, busy, sum_cf, sum_cb, sum_x,
                            sent, mem, meas, val_normal)  # fmt: skip

    def _advance(self, t: float) -> None:
        """Process every fault event scheduled at or before ``t``."""
        env = self._env
        while env.peek() <= t:
            env.step()

    def _step(self, batch: int, steps: int) -> None:
        conv = self.convergence
        phi = self.phi
        per_step = (
            conv.progress_per_step if phi == 1.0 else (lambda gb, p: conv.progress_per_step(gb, p) / phi)
        )
        dp = advance(per_step, batch, self._progress, steps)
        self._memory = conv.update_batch_memory(self._memory, batch, dp)
        self._progress += dp
        self._samples += steps * batch

    def _report(self, sizes, M, K, interval, iter_time, repart, stall, busy, sum_cf, sum_cb, sum_x, sent,
                mem, meas, val_normal) -> PipelineReport:  # fmt: skip
        st, conv = self._state, self.convergence
        wall = max(interval, 1e-12)
        train = max(iter_time, 1e-12)
        acc = conv.accuracy(self._progress, self._memory)
        sd = validation_sd(acc, self.model.workload.val_samples)
        slow = np.array(
            [st.gpu_slowdown[list(w)][st.alive[list(w)]].max(initial=1.0) for w in self.stage_workers]
        )
        events = st.log[self._log_cursor :]
        self._log_cursor = len(st.log)
        return PipelineReport(
            sizes=sizes,
            micro_batches=M,
            schedule=self.schedule,
            fwd_time_s=sum_cf / K * meas[0],
            bwd_time_s=sum_cb / K * meas[0],
            send_time_s=sum_x / K,
            bubble_fraction=np.clip(1.0 - busy / train, 0.0, 1.0),
            idle_fraction=np.clip(1.0 - busy / wall, 0.0, 1.0),
            gpu_util=np.clip(busy / wall * meas[1], 0.0, 1.0),
            mem_util=np.clip(mem / self.stage_cap_bytes * meas[2], 0.0, 1.0),
            link_bytes_per_s=sent / wall,
            iteration_time_s=iter_time / K,
            iterations=K,
            interval_time_s=interval,
            wall_time_s=self._t,
            repartition_time_s=repart,
            stall_time_s=stall,
            val_accuracy=float(np.clip(acc + sd * val_normal, 0.0, 1.0)),
            samples=self._samples,
            events=tuple(str(e) for e in events),
            truth={
                "progress": self._progress,
                "val_accuracy": acc,
                "stage_slowdown": slow,
                "gpu_slowdown": st.gpu_slowdown.copy(),
                "alive": st.alive.copy(),
                "bandwidth_factor": st.bandwidth_factor,
            },
        )
