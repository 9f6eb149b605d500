"""The batched engine: many independent simulated clusters stepped as arrays ``[clusters, workers]``.

:class:`BatchedSimulator` runs the arithmetic of :meth:`sim.engine.Simulator.run_interval` for a
batch of clusters at once (any mix of sizes, GPU types, workloads and scenarios; smaller clusters
are padded), over arrays ``[clusters, workers, K]`` of one interval's iterations:

    T_compute[c, i, j] = exp(cv_c z[c, i, j] + ln smooth_max(host, T_gpu(b) slowed, k) - cv_c^2 / 2)
    T_slowest[c, j]    = max_i T_compute[c, i, j]
    T_iter[c, j]       = smooth_max(T_slowest, (T_sync / bandwidth + 2 (R - 1) latency) jitter, gamma)

and then progress, the noise-scale inputs, measurement noise and every report field as the engine
computes them. Faults do not depend on the controller, so each cluster's fault events come from a
:class:`sim.fault_timeline.FaultTimeline` (the engine's own SimPy processes, seeds and draws), read
by time: an interval is split into segments at every event time as the engine splits it, clusters
without an event in their interval (nearly all) in one wide pass, the others in further passes over
just them. The random draws come from :mod:`sim.batched_noise`: each cluster's own stream (the
engine's numbers: same seeds, same reports within floating-point rounding) or one stream for the
batch (the fast path: the same distributions).

Not carried over from the engine: elastic worker sets (``set_workers``), extra SimPy processes
(``start_process``) and ``progress_scale`` (``sim.elastic``'s; refused when not 1.0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.batched_noise import BatchNoise, StreamNoise, batch_generator, chunk_rows
from sim.batched_world import ConvergenceTables, WorldArrays
from sim.engine import Simulator
from sim.fault_timeline import FaultTimeline
from sim.measurement import counters
from sim.network import TCP_MSS_BYTES
from sim.validation import check_choice, check_int

NOISE_MODES = ("stream", "batch")


@dataclass
class BatchReport:
    """The interval reports of a batch of clusters: :class:`sim.protocol.IntervalReport`'s fields as
    arrays ``[clusters, workers]`` (per worker, padded slots 0) and ``[clusters]`` (global), plus the
    truth the engine puts in ``report.truth``. :meth:`BatchedSimulator.report` builds one cluster's
    ``IntervalReport``."""

    idx: np.ndarray
    local_batch: np.ndarray
    alive: np.ndarray
    iteration_time_s: np.ndarray
    compute_time_s: np.ndarray
    idle_time_s: np.ndarray
    samples_per_s: np.ndarray
    net_bytes_per_s: np.ndarray
    tcp_retransmissions: np.ndarray
    cpu_util: np.ndarray
    mem_util: np.ndarray
    gpu_util: np.ndarray
    gpu_mem_util: np.ndarray
    batch_accuracy: np.ndarray
    batch_loss: np.ndarray
    grad_norm_mean: np.ndarray
    grad_norm_var: np.ndarray
    local_grad_sqr: np.ndarray
    iterations: int
    interval_time_s: np.ndarray
    wall_time_s: np.ndarray
    reconfig_time_s: np.ndarray
    comm_time_s: np.ndarray
    global_batch: np.ndarray
    global_grad_sqr: np.ndarray
    val_accuracy: np.ndarray
    val_loss: np.ndarray
    samples: np.ndarray
    epoch: np.ndarray
    truth: dict[str, np.ndarray]
    log_span: np.ndarray  # [clusters, 2]: the fault-log lines that fall in the interval


class BatchedSimulator:
    """``clusters`` independent simulated training runs stepped together.

    Args:
        worlds: one :class:`sim.engine.Simulator` per cluster, the description of its world (its
            own clock is never run); :meth:`set_world` replaces one between runs.
        noise: ``"stream"`` (each cluster's own noise stream: the engine's reports, number for
            number) or ``"batch"`` (one stream for the batch: the fast path).
        seed: seeds the batch's noise stream (``noise="batch"``).
        max_workers: width of the worker arrays (default: the largest world's).
    """

    def __init__(
        self,
        worlds: Sequence[Simulator],
        noise: str = "batch",
        seed: int | None = None,
        max_workers: int | None = None,
    ) -> None:
        if not worlds:
            raise ValueError("BatchedSimulator needs at least one world")
        self.noise_mode = check_choice("noise", noise, NOISE_MODES)
        c = len(worlds)
        w = (
            max(s.num_workers for s in worlds)
            if max_workers is None
            else check_int("max_workers", max_workers, 1)
        )
        self.clusters, self.width = c, w
        self.world = WorldArrays(c, w)
        self.conv = ConvergenceTables(c)
        self.noise = StreamNoise(c) if noise == "stream" else BatchNoise(batch_generator(seed))
        self.timelines: list[FaultTimeline | None] = [None] * c
        f = np.zeros
        self.gpu_slowdown, self.host_slowdown = np.ones((c, w)), np.ones((c, w))
        self.cpu_load, self.speed = f((c, w)), np.ones((c, w))
        self.alive = f((c, w), dtype=bool)
        self.bandwidth, self.loss = np.ones(c), f(c)
        self.pending, self.t, self.progress, self.memory = f(c), f(c), f(c), np.full(c, np.nan)
        self.noise_progress = f(c)  # the gradient statistics' counter (sim.convergence: q)
        self.samples = f(c, dtype=np.int64)
        self.last_batches = f((c, w), dtype=np.int64)
        self.has_last = f(c, dtype=bool)
        self.cursor = f(c, dtype=np.int64)  # events processed
        self.next_t = np.full(c, math.inf)
        self.log_cursor = f(c, dtype=np.int64)
        self.log_end = f(c, dtype=np.int64)  # fault-log lines after the events processed
        self.started = f(c, dtype=bool)
        self._chunk: np.ndarray | None = None  # scratch of one chunk of compute times
        for i, sim in enumerate(worlds):
            self.set_world(i, sim)

    # --- worlds and runs ------------------------------------------------------------------------------
    def set_world(self, i: int, sim: Simulator) -> None:
        """Cluster ``i`` simulates ``sim``'s world from its next :meth:`reset`."""
        self.world.set(i, sim)
        self.conv.set(i, sim.convergence)
        self.started[i] = False

    def reset(self, i: int, rng: np.random.Generator) -> None:
        """A fresh run of cluster ``i`` at time 0, its draws from ``rng`` as
        :meth:`Simulator.reset(rng=rng) <sim.engine.Simulator.reset>` makes them."""
        sim = self.world.sims[i]
        fault_rng, noise_rng = rng.spawn(2)
        tl = FaultTimeline(sim.scenario, sim.gpu_types, sim.node_of_worker, fault_rng)
        self.timelines[i] = tl
        self.noise.start(i, noise_rng)
        self._apply_state(i, tl.initial)
        self.pending[i] = self.t[i] = self.progress[i] = self.noise_progress[i] = 0.0
        self.memory[i] = np.nan
        self.samples[i] = 0
        self.has_last[i] = False
        self.cursor[i] = self.log_cursor[i] = self.log_end[i] = 0
        self.next_t[i] = tl.time(0)
        self.started[i] = True

    def _apply_state(self, i: int, state: tuple) -> None:
        n = self.world.num_workers[i]
        gpu, host, cpu, alive, speed, bandwidth, loss = state
        self.gpu_slowdown[i, :n], self.host_slowdown[i, :n] = gpu, host
        self.cpu_load[i, :n], self.alive[i, :n], self.speed[i, :n] = cpu, alive, speed
        self.bandwidth[i], self.loss[i] = bandwidth, loss

    def _advance(self, clusters: np.ndarray, until: np.ndarray, strict: bool = False) -> None:
        """Process every event of ``clusters`` at or before ``until`` (before it when ``strict``)."""
        due = self.next_t[clusters] < until if strict else self.next_t[clusters] <= until
        if not due.any():
            return
        for i, u in zip(clusters[due].tolist(), until[due].tolist(), strict=True):
            tl, k = self.timelines[i], int(self.cursor[i])
            while (tl.time(k) < u) if strict else (tl.time(k) <= u):
                self.pending[i] += tl.delay(k)
                k += 1
            self.cursor[i] = k
            self.log_end[i] = tl.log_end(k - 1)
            self.next_t[i] = tl.time(k)
            self._apply_state(i, tl.state(k - 1))

    # --- the interval -------------------------------------------------------------------------------
    def _check_batches(self, idx: np.ndarray, b: np.ndarray) -> np.ndarray:
        w = self.world
        if b.shape != (len(idx), self.width):
            raise ValueError(f"local_batches must have shape ({len(idx)}, {self.width}), got {b.shape}")
        valid = w.valid[idx]
        if not np.issubdtype(b.dtype, np.integer):
            real = np.where(valid, b, 1)
            if (
                not np.issubdtype(b.dtype, np.floating)
                or not np.all(np.isfinite(real))
                or np.any(real != np.round(real))
            ):
                raise ValueError(f"local_batches must be whole numbers, got {b.tolist()}")
        b = np.where(valid, b, 1).astype(np.int64)
        bad = valid & ((b < w.min_batch[idx]) | (b > w.max_batch[idx]))
        if bad.any():
            row, col = (int(x[0]) for x in np.nonzero(bad))
            i = int(idx[row])
            raise ValueError(
                f"local_batches[{i}][{col}] = {int(b[row, col])} is outside worker {col}'s allowed range "
                f"[{int(w.min_batch[i, col])}, {int(w.max_batch[i, col])}] (cluster {i})"
            )
        return b

    def run_interval(self, local_batches, iterations: int = 50, idx=None) -> BatchReport:
        """Run ``iterations`` iterations of clusters ``idx`` (default: all) at ``local_batches``
        (``[len(idx), max_workers]``, padded slots ignored) and report what each measured."""
        idx = np.arange(self.clusters) if idx is None else np.asarray(idx, dtype=np.int64)
        if not self.started[idx].all():
            raise RuntimeError(
                "BatchedSimulator.reset(i, rng) must be called for every cluster before it runs"
            )
        k_iters = check_int("iterations (K)", iterations, 1, 1_000_000)
        b = self._check_batches(idx, np.asarray(local_batches))
        w, c, width = self.world, len(idx), self.width
        nw = w.num_workers[idx]
        d = self.noise.draw(idx, k_iters, nw, width)
        t_start = self.t[idx].copy()

        changed = self.has_last[idx] & np.any(b != self.last_batches[idx], axis=1)
        reconfig = np.where(changed, w.reconfig_delay_s[idx], 0.0)
        self.last_batches[idx] = b
        self.has_last[idx] = True
        valid = w.valid[idx]
        mem = self.memory[idx]
        fresh = np.isnan(mem)
        if fresh.any():
            mem[fresh] = np.log2(np.where(valid, b, 0).sum(axis=1)[fresh].astype(np.float64))
        self.memory[idx] = mem
        t = t_start + reconfig + w.interval_overhead_s[idx]
        self._advance(idx, t)

        bf = b.astype(np.float64)
        acc = _Sums(c, width)
        j = np.zeros(c, dtype=np.int64)
        cv = w.compute_cv[idx]
        off_cv = 0.5 * cv**2
        bcv = w.bandwidth_cv[idx][:, None]
        jitter = np.exp(bcv * d.sync - 0.5 * bcv**2)
        latency = d.latency * w.latency_jitter_s[idx][:, None]
        rows = np.arange(c)
        while True:
            todo = rows[j < k_iters]
            if todo.size == 0:
                break
            ci = idx[todo]
            pend = self.pending[ci] > 0
            if pend.any():  # elastic restart after a worker was lost or came back
                p_rows, p_ci = todo[pend], ci[pend]
                acc.stall[p_rows] += self.pending[p_ci]
                t[p_rows] += self.pending[p_ci]
                self.pending[p_ci] = 0.0
                self._advance(p_ci, t[p_rows])
                todo, ci = todo[~pend], ci[~pend]
                if todo.size == 0:
                    continue
            self._segment(todo, ci, j, t, bf, acc, d, cv, off_cv, jitter, latency, k_iters)
            left = todo[j[todo] < k_iters]
            if left.size:
                self._advance(idx[left], t[left])
        self._advance(idx, t, strict=True)
        self.t[idx] = t
        self.samples[idx] += acc.samples
        return self._measure(idx, b, k_iters, t - t_start, reconfig, acc, d)

    def _segment(self, todo, ci, j, t, bf, acc, d, cv, off_cv, jitter, latency, k_iters) -> None:
        """The iterations of clusters ``todo`` (rows of this interval; ``ci`` their indices) from
        their iteration ``j`` up to their next event, in the state those clusters are in."""
        w = self.world
        alive = self.alive[ci]
        if not alive.any(axis=1).all():
            raise RuntimeError("every worker is lost: the scenario leaves no worker to train on")
        replicas = alive.sum(axis=1)
        node = w.node[ci]
        multi = np.where(alive, node, np.iinfo(np.int64).max).min(axis=1) != np.where(alive, node, -1).max(
            axis=1
        )
        mi = multi.astype(np.int64)
        base_sync = w.base_sync_s[ci, replicas, mi]
        gamma = w.gamma[ci, replicas, mi]
        b = bf[todo]
        gpu_t = w.alpha[ci] + w.beta[ci] * b ** w.exponent[ci]
        knee = w.knee_beta[ci] > 0
        if knee.any():
            gpu_t = gpu_t + w.knee_beta[ci] * np.maximum(0.0, b - w.knee_b[ci])
        gpu_t = gpu_t * self.gpu_slowdown[ci]
        host_t = w.host[ci] * self.host_slowdown[ci]
        k = w.k[ci]
        m_ = np.maximum(host_t, gpu_t)
        safe = np.where(m_ > 0, m_, 1.0)
        smooth = m_ * ((host_t / safe) ** k + (gpu_t / safe) ** k) ** (1.0 / k)
        with np.errstate(divide="ignore"):
            log_comp = np.where(alive, np.log(smooth), -np.inf) - off_cv[todo][:, None]
        jj = j[todo]
        shifted = bool(jj.any())
        if shifted:  # later segments: iteration j of the interval is column 0
            cols = np.minimum(jj[:, None] + np.arange(k_iters), k_iters - 1)
            jit, lat = np.take_along_axis(jitter[todo], cols, 1), np.take_along_axis(latency[todo], cols, 1)
            sel = todo
        else:
            every = len(todo) == len(jitter)  # every cluster of the step: no gather
            jit, lat = (jitter, latency) if every else (jitter[todo], latency[todo])
            cols, sel = None, None if every else todo
        ring = 2 * (replicas - 1)
        sync = (base_sync / self.bandwidth[ci])[:, None] + ring[:, None] * lat
        sync *= jit
        sync[replicas <= 1] = 0.0
        seg = _Segment(sync, gamma[:, None], t[todo], self.next_t[ci], k_iters - jj, shifted, self.width)
        self._compute_pass(d.compute, sel, cols, cv[todo], log_comp, seg)
        slowest, it, m, comp_sum = seg.slowest, seg.it, seg.m, seg.comp_sum
        if seg.all_full:
            seg_time = it.sum(axis=1)
            slow_sum = slowest.sum(axis=1)
            comm = (it - slowest).sum(axis=1)
        else:
            mask = np.arange(k_iters) < m[:, None]
            seg_time = np.where(mask, it, 0.0).sum(axis=1)
            slow_sum = np.where(mask, slowest, 0.0).sum(axis=1)
            comm = np.where(mask, it - slowest, 0.0).sum(axis=1)
        mf = m.astype(np.float64)[:, None]
        acc.compute[todo] += comp_sum
        acc.idle[todo] += np.where(alive, slow_sum[:, None] - comp_sum, 0.0)
        acc.gpu_busy[todo] += np.where(alive, gpu_t * mf, 0.0)
        acc.host_busy[todo] += np.where(alive, host_t * mf, 0.0)
        acc.cpu_load[todo] += self.cpu_load[ci] * seg_time[:, None]
        acc.iters_alive[todo] += alive * mf
        acc.iter_time[todo] += seg_time
        acc.comm[todo] += comm
        seg_bytes = np.where(alive, w.bytes_per_iteration[ci, replicas][:, None] * mf, 0.0)
        acc.bytes_sent[todo] += seg_bytes
        if multi.any():  # inter-node traffic rides on TCP
            loss = (w.loss_rate[ci] + self.loss[ci])[:, None]
            acc.retrans_expected[todo] += np.where(multi[:, None], seg_bytes / TCP_MSS_BYTES * loss, 0.0)
        ran = m > 0
        if not ran.all():
            todo, ci, b, alive, m, seg_time = todo[ran], ci[ran], b[ran], alive[ran], m[ran], seg_time[ran]
        gb = np.where(alive, b, 0.0).sum(axis=1)
        acc.global_batch[todo] = gb
        dp, dq = self.conv.advance(ci, gb, self.progress[ci], self.noise_progress[ci], m.astype(np.float64))
        self.memory[ci] = self.conv.update_batch_memory(ci, self.memory[ci], gb, dp)
        self.progress[ci] += dp
        self.noise_progress[ci] += dq
        acc.samples[todo] += gb.astype(np.int64) * m
        t[todo] += seg_time
        j[todo] += m

    def _compute_pass(self, z_all, sel, cols, cv, log_comp, seg: _Segment) -> None:
        """The compute times of rows ``sel`` of ``z_all`` (None: all of them) at columns ``cols``
        (None: as they are), their iteration times and where the segment ends, into ``seg``; a chunk
        of clusters at a time, so that a chunk's ``[rows, W, K]`` arrays stay in cache and no such
        array of the whole batch is made."""
        rows = len(z_all) if sel is None else len(sel)
        width, k = z_all.shape[1], z_all.shape[2]
        step = chunk_rows(width, k)
        buf = self._chunk_buffer(min(step, rows) * width * k)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            z = z_all[r0:r1] if sel is None else z_all[sel[r0:r1]]
            if cols is not None:
                z = np.take_along_axis(z, cols[r0:r1, None, :], axis=2)
            comp = _compute_times(z, cv[r0:r1], log_comp[r0:r1], buf[: z.size].reshape(z.shape))
            seg.chunk(r0, r1, comp)

    def _chunk_buffer(self, size: int) -> np.ndarray:
        if self._chunk is None or self._chunk.size < size:
            self._chunk = np.empty(size)
        return self._chunk[:size]

    def _measure(self, idx, b, k_iters, interval_time, reconfig, acc, d) -> BatchReport:
        w, conv = self.world, self.conv
        nw = w.num_workers[idx]
        measured = counters(
            acc,
            b,
            k_iters,
            interval_time,
            np.exp(w.meas_cv[idx][:, None, None] * d.meas),
            compute_on_host=w.compute_on_host[idx],
            host_mem=(w.host_mem_fixed[idx], w.host_mem_per_sample[idx]),
            gpu_mem=(w.gpu_mem_fixed[idx], w.gpu_mem_per_sample[idx]),
        )
        took_part = measured["alive"]
        valid = w.valid[idx]
        measured["gpu_mem_util"] = np.where(valid, measured["gpu_mem_util"], 0.0)
        retrans = self.noise.poisson(idx, acc.retrans_expected, nw)

        progress, memory = self.progress[idx], self.memory[idx]
        acc_val = conv.accuracy(idx, progress, memory)
        acc_train = conv.train_accuracy(idx, progress, acc_val)[:, None]
        n_seen = np.maximum(b * acc.iters_alive, 1.0)
        sd_train = np.sqrt(acc_train * (1.0 - acc_train) / n_seen)
        batch_acc = np.where(took_part, np.clip(acc_train + sd_train * d.batch_normal, 0.0, 1.0), 0.0)
        sd_val = np.sqrt(acc_val * (1.0 - acc_val) / w.val_samples[idx])
        val_acc = np.clip(acc_val + sd_val * d.val_normal, 0.0, 1.0)
        classes = w.num_classes[idx]
        chance = 1.0 / classes
        log_c = np.log(classes)
        batch_loss = np.where(
            took_part, log_c[:, None] * np.maximum((1.0 - batch_acc) / (1.0 - chance)[:, None], 0.0), 0.0
        )
        val_loss = log_c * np.maximum((1.0 - val_acc) / (1.0 - chance), 0.0)

        # Gradient statistics: |g_i|^2 = c_i G with c_i = |G|^2 + tr(Sigma) / b_i (sim.engine).
        q = self.noise_progress[idx]
        g2, v = conv.grad_stats(idx, q)
        m0 = conv.base_batch[idx]
        scale = g2[:, None] + (v * m0)[:, None] / b
        mean_g, mean_root = d.grad_mean, d.grad_root_mean
        var_root = np.maximum(mean_g - mean_root**2, 0.0)
        gb = np.maximum(acc.global_batch, 1)
        global_sqr = (g2 + v * m0 / gb) * d.grad_global

        noise_scale = conv.noise_scale(idx, q)
        span = np.stack([self.log_cursor[idx], self.log_end[idx]], axis=1)
        self.log_cursor[idx] = self.log_end[idx]
        truth = {
            "progress": progress,
            "noise_scale": noise_scale,
            "efficiency": (noise_scale + m0) / (noise_scale + gb),
            "grad_sqr": g2,
            "grad_var": v,
            "val_accuracy": acc_val,
            "batch_memory_log2": memory,
            "speed": self.speed[idx].copy(),
            "gpu_slowdown": self.gpu_slowdown[idx].copy(),
            "host_slowdown": self.host_slowdown[idx].copy(),
            "bandwidth_factor": self.bandwidth[idx].copy(),
            "alive": self.alive[idx].copy(),
            "stall_s": acc.stall,
        }
        return BatchReport(
            idx=idx,
            local_batch=np.where(valid, b, 0),
            **measured,
            tcp_retransmissions=retrans,
            batch_accuracy=batch_acc,
            batch_loss=batch_loss,
            grad_norm_mean=np.where(took_part, np.sqrt(scale) * mean_root, 0.0),
            grad_norm_var=np.where(took_part, scale * var_root, 0.0),
            local_grad_sqr=np.where(took_part, scale * mean_g, 0.0),
            iterations=k_iters,
            interval_time_s=interval_time,
            wall_time_s=self.t[idx].copy(),
            reconfig_time_s=reconfig,
            comm_time_s=acc.comm / k_iters,
            global_batch=acc.global_batch.astype(np.int64),
            global_grad_sqr=global_sqr,
            val_accuracy=val_acc,
            val_loss=val_loss,
            samples=acc.samples.copy(),
            epoch=self.samples[idx] / w.samples_per_epoch[idx],
            truth=truth,
            log_span=span,
        )

    # --- one cluster's report as the engine's record ------------------------------------------------
    def report(self, batch: BatchReport, row: int):
        """Row ``row`` of ``batch`` as a :class:`sim.protocol.IntervalReport` (the engine's form)."""
        from sim.protocol import IntervalReport

        i = int(batch.idx[row])
        n = int(self.world.num_workers[i])
        per_worker = {f: getattr(batch, f)[row, :n].copy() for f in _PER_WORKER}
        glob = {f: float(getattr(batch, f)[row]) for f in _GLOBAL_FLOAT}
        start, end = (int(x) for x in batch.log_span[row])
        truth = {
            key: (val[row, :n].copy() if val.ndim == 2 else float(val[row]))
            for key, val in batch.truth.items()
        }
        return IntervalReport(
            **per_worker,
            **glob,
            iterations=batch.iterations,
            global_batch=int(batch.global_batch[row]),
            samples=int(batch.samples[row]),
            events=tuple(str(e) for e in self.timelines[i].log(start, end)),
            truth=truth,
        )


_PER_WORKER = ("local_batch", "alive", "iteration_time_s", "compute_time_s", "idle_time_s", "samples_per_s",
               "net_bytes_per_s", "tcp_retransmissions", "cpu_util", "mem_util", "gpu_util", "gpu_mem_util",
               "batch_accuracy", "batch_loss", "grad_norm_mean", "grad_norm_var", "local_grad_sqr")  # fmt: skip
_GLOBAL_FLOAT = ("interval_time_s", "wall_time_s", "reconfig_time_s", "comm_time_s", "global_grad_sqr",
                 "val_accuracy", "val_loss", "epoch")  # fmt: skip


def _compute_times(z, cv, log_comp, out=None) -> np.ndarray:
    """T_compute = exp(cv z + ln T_mean - cv^2 / 2) ``[rows, W, K]`` (``log_comp`` holds the last
    two terms; dead workers -inf), into ``out`` when given."""
    comp = np.multiply(z, cv[:, None, None], out=out)
    comp += log_comp[:, :, None]
    return np.exp(comp, out=comp)


class _Segment:
    """One segment's per-iteration arrays, filled a chunk of rows at a time by
    :meth:`BatchedSimulator._compute_pass`: the slowest worker's compute time, the iteration time
    T_iter = smooth_max(T_slowest, T_sync, gamma) ``[rows, K]``, the iterations ``m`` that start
    before the row's next event (at most ``limit``) and per worker the sum of its compute times
    over those ``[rows, W]``."""

    def __init__(self, sync, gamma, t0, next_t, limit, shifted: bool, width: int) -> None:
        rows, k = sync.shape
        self.sync, self.gamma, self.t0, self.next_t, self.limit = sync, gamma, t0, next_t, limit
        self.shifted = shifted  # a later segment: columns past the row's end repeat its last one
        self.slowest, self.it = np.empty((rows, k)), np.empty((rows, k))
        self.m = np.empty(rows, dtype=np.int64)
        self.comp_sum = np.empty((rows, width))
        self.all_full = not shifted

    def chunk(self, r0: int, r1: int, comp: np.ndarray) -> None:
        slowest = comp.max(axis=1, out=self.slowest[r0:r1])
        sync, g = self.sync[r0:r1], self.gamma[r0:r1]
        mx = np.maximum(slowest, sync)
        it = self.it[r0:r1]
        np.multiply(mx, ((slowest / mx) ** g + (sync / mx) ** g) ** (1.0 / g), out=it)
        starts = np.empty_like(it)
        starts[:, 0] = 0.0
        np.cumsum(it[:, :-1], axis=1, out=starts[:, 1:])
        starts += self.t0[r0:r1, None]
        limit = self.limit[r0:r1]
        m = np.minimum((starts < self.next_t[r0:r1, None]).sum(axis=1), limit, out=self.m[r0:r1])
        if not self.shifted and np.array_equal(m, limit):
            comp.sum(axis=2, out=self.comp_sum[r0:r1])
        else:
            self.all_full = False
            mask = np.arange(comp.shape[2]) < m[:, None]
            np.where(mask[:, None, :], comp, 0.0).sum(axis=2, out=self.comp_sum[r0:r1])


class _Sums:
    """Running sums over the iterations of one interval, per cluster of the step."""

    def __init__(self, c: int, w: int) -> None:
        f = np.zeros
        self.compute, self.idle, self.gpu_busy, self.host_busy = f((c, w)), f((c, w)), f((c, w)), f((c, w))
        self.cpu_load, self.iters_alive, self.retrans_expected = f((c, w)), f((c, w)), f((c, w))
        self.bytes_sent = f((c, w))
        self.iter_time, self.comm, self.stall = f(c), f(c), f(c)
        self.samples = f(c, dtype=np.int64)
        self.global_batch = f(c)
