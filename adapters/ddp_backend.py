"""DDPBackend: the backend protocol over real PyTorch DDP training.

## Design
The env's process is the *coordinator*; it is not a rank. At ``reset`` it starts ``workers``
persistent worker processes (``spawn``; :mod:`adapters.worker`) that form one torch.distributed
group (gloo by default) through a ``TCPStore`` the coordinator hosts, and keeps one pipe to each.
Every interval it sends every rank the same command - the local batches of all ranks, K, the
learning rate, the fault schedule - and gathers one reply per rank: measured per-iteration compute,
wait and iteration times, gradient statistics, batch accuracy and loss, CPU and memory use, and
(rank 0) the held-out validation accuracy. Because the decision is made here and handed to all
ranks at an interval boundary, every rank applies the same batches and enters the same collectives.

Per iteration, measured on each rank (``adapters.worker``):

    compute_i = input slice + forward + backward until the last gradient bucket is ready
                + emulated slow-down + optimiser step
    wait_i    = from then until the all-reduce completes (waiting for the slowest + the all-reduce)
                + emulated network delay
    idle_i    = max_j compute_j - compute_i                 # the barrier wait, as in the simulator
    comm      = min_i wait_i                                # the slowest rank's wait: exposed all-reduce

Start-up: a spawned process normally re-imports the parent's ``__main__`` module before it runs its
target; the ranks need nothing from it (their entry point is :func:`adapters.worker.worker_main`),
so they are started without it (:func:`_main_not_reimported`): an app that imports the gym, SB3 and
Hydra otherwise pays their import in every rank at every start and elastic restart.

Failures: a rank that dies (its process exits) or hangs (its peers' collectives time out after
``timeout_s``) makes ``run_interval`` raise :class:`WorkerFailure` naming the rank, after every
worker process has been killed and reaped.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import wait as mp_wait
from os import PathLike
from typing import Any

import numpy as np
import psutil
import torch.distributed as dist

from adapters import checkpoint as ckpt
from adapters.config import RealDDPConfig
from adapters.ddp_state import BackendState
from adapters.faults import FaultEmulator
from adapters.hostmetrics import HostSnapshot
from adapters.worker import worker_main
from dynamix_gym.stats import NoiseScaleEstimator
from sim.guards import Guard, TrainingDiverged
from sim.protocol import BackendSpec, IntervalReport

__all__ = ["DDPBackend", "TrainingDiverged", "WorkerFailure"]

log = logging.getLogger(__name__)

#: After the first rank reports a failure, how long to wait for the others' last words.
FAILURE_GRACE_S = 1.0


@contextmanager
def _main_not_reimported(config: RealDDPConfig) -> Iterator[None]:
    """While it is open, processes spawned here do not re-import the parent's ``__main__`` (its
    ``__spec__`` and ``__file__`` are hidden from multiprocessing's preparation data); left as it is
    when the config holds an object defined in ``__main__`` (a rank would need it to unpickle)."""
    main = sys.modules.get("__main__")
    if main is None or any(type(v).__module__ == "__main__" for v in vars(config).values()):
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            main.__dict__.pop("__spec__", None)


class WorkerFailure(RuntimeError):
    """A worker rank died, hung or raised; ``rank`` is the one that failed first."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


def _exit_description(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exit code {code}"
    return f"exit code {code}"


class DDPBackend(BackendState):
    """Real synchronous data-parallel training as a :class:`dynamix_gym.Backend`.

    ``guard`` (:class:`sim.guards.Guard`, from ``config.guards``) watches every interval; when it
    fires, the ranks and the coordinator go back to the last good snapshot, the interval is run
    again at the snapshot's batches, and the fallback holds them for the cool-down (the report's
    ``events`` say so, and so does ``guard.events``).

    Args:
        config: a :class:`RealDDPConfig`; or pass its fields as keyword arguments.
    """

    def __init__(self, config: RealDDPConfig | None = None, **kwargs: Any) -> None:
        if config is None:
            kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
            config = RealDDPConfig(**kwargs)
        elif kwargs:
            config = replace(config, **kwargs)
        self.config = cfg = config
        n = cfg.workers
        gpu_types = tuple(cfg.emulate) if cfg.emulate else (cfg.device,) * n
        self._resume_from = ckpt.latest(cfg.checkpoint_dir) if cfg.resume else None
        initial = np.array(cfg.per_worker(cfg.initial_batch, "initial_batch"), dtype=np.int64)
        if self._resume_from is not None:
            meta = ckpt.load(self._resume_from / "coordinator.pt")
            initial = np.asarray(meta["batches"], dtype=np.int64)
        self.spec = BackendSpec(
            gpu_types=gpu_types,
            node_of_worker=(0,) * n,
            min_batch=np.array(cfg.per_worker(cfg.min_batch, "min_batch"), dtype=np.int64),
            max_batch=np.array(cfg.per_worker(cfg.max_batch, "max_batch"), dtype=np.int64),
            initial_batch=initial,
            base_batch=int(cfg.base_batch),
            target_accuracy=cfg.target_quality,  # the task's target as a rising quality
            time_budget_s=float(cfg.time_budget_s),
            num_classes=cfg.task.num_classes,
            workload=f"{cfg.model}/{cfg.dataset}",
            deterministic=False,
            metric=cfg.task.metric,
            lr_rule=cfg.lr_rule,
        )
        if cfg.compute_profile is not None:
            self.use_compute_profile(cfg.compute_profile)
        self.faults = FaultEmulator(
            cfg.scenario,
            n,
            gpu_types,
            emulate=tuple(cfg.emulate) if cfg.emulate else None,
            time_scale=cfg.fault_time_scale,
            emulate_app=cfg.emulate_app,
        )
        #: the learning-rate rule's noise-scale estimate, from the intervals after the run's first
        #: ``lr_noise_warmup`` (the guards' ``lr_gain_warmup``: the first one's overshoots)
        self.noise = NoiseScaleEstimator(cfg.noise_smoothing)
        self.lr_noise_warmup = cfg.guards.gain_warmup()
        #: name -> callable returning picklable state, saved with every checkpoint (e.g. a controller).
        self.extra_state: dict[str, Callable[[], Any]] = {}
        #: the ``extra_state`` values of the checkpoint the last ``reset`` resumed from.
        self.restored_extra: dict[str, Any] = {}
        self.resumed_interval: int | None = None
        #: scales the lr rule's learning rate (an elastic controller's learning-rate decision).
        self.lr_multiplier = 1.0
        self.guard = Guard(cfg.guards)
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[Any] = []
        self._pids: list[int] = []
        self._store: dist.TCPStore | None = None
        self._healthy = False
        self._reset_done = False
        self.train_size = 0

    @property
    def resuming(self) -> bool:
        """Whether the next :meth:`reset` continues from a checkpoint (at its batches)."""
        return self._resume_from is not None

    def use_compute_profile(self, ref: str | PathLike) -> None:
        """Carry the compute curve of ``ref``'s compute model of these ranks in the spec
        (:attr:`~sim.protocol.BackendSpec.compute_curve_s`, read by observation schema 4): the quick
        calibration's refit, measured right before the run. An env over this backend takes the new
        spec at its next reset."""
        from sim.profile import load_profile, profile_compute_curve

        profile = load_profile(ref)
        spec = self.spec
        curve = profile_compute_curve(profile, spec.gpu_types, spec.min_batch, spec.max_batch)
        self.spec = replace(spec, compute_curve_s=curve)
        self.config = replace(self.config, compute_profile=str(ref))

    # --- lifecycle -------------------------------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        return list(self._pids)

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        rng = rng if rng is not None else np.random.default_rng(seed)
        run_seed = int(rng.integers(2**31 - 1))
        if self._healthy:
            self._command("reset", {"seed": run_seed})
        else:
            self._shutdown(kill=True)
            self._spawn(run_seed)
        self.run_seed = run_seed
        self._wall_offset_s = 0.0
        self._samples = 0
        self._intervals = 0
        self._last_batches: np.ndarray | None = None
        self._good = self.spec.initial_batch.copy()
        self._last_comm_s = 0.0
        self.noise.reset()
        self.faults.reset(run_seed)
        self.restored_extra = {}
        self.resumed_interval = None
        self.guard.reset()
        self._held_state: dict[str, Any] | None = None
        if self._resume_from is not None:
            self._restore(self._resume_from)
            self._resume_from = None  # only the first reset resumes
        self._t0 = time.perf_counter()
        self._reset_done = True

    def _spawn(self, seed: int) -> None:
        with _main_not_reimported(self.config):
            self._start_ranks(seed)

    def _start_ranks(self, seed: int) -> None:
        cfg = self.config
        ctx = mp.get_context("spawn")
        self._store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timedelta(seconds=cfg.start_timeout_s), wait_for_workers=False
        )
        for rank in range(cfg.workers):
            parent, child = ctx.Pipe(duplex=True)
            p = ctx.Process(
                target=worker_main,
                args=(rank, cfg, child, self._store.port, seed),
                name=f"dynamix-ddp-rank{rank}",
                daemon=True,
            )
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        self._pids = [int(p.pid) for p in self._procs]
        replies = self._gather("start", deadline_s=cfg.start_timeout_s)
        self.train_size = int(replies[0]["train_size"])
        self._healthy = True
        log.info("started %d DDP workers (pids %s)", cfg.workers, self._pids)

    def close(self) -> None:
        """Stop every worker (politely, then by force) and reap it; safe to call twice."""
        self._shutdown(kill=False)

    def _shutdown(self, kill: bool) -> None:
        procs, conns = self._procs, self._conns
        self._procs, self._conns, self._healthy = [], [], False
        if not kill:
            for c in conns:
                try:
                    c.send(("stop", {}))
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + 10.0
            for p in procs:
                p.join(timeout=max(deadline - time.monotonic(), 0.0))
        for p in procs:
            if p.is_alive():
                p.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        for p in procs:
            p.join(timeout=10.0)
            if p.exitcode is None:  # pragma: no cover - the kernel did not reap it in time
                log.error("worker pid %s did not exit after SIGKILL", p.pid)
        for c in conns:
            c.close()
        self._store = None

    def __del__(self) -> None:  # a forgotten close() must not leave orphans behind
        try:
            if self._procs:
                self._shutdown(kill=True)
        except Exception:
            pass

    # --- commanding the ranks ------------------------------------------------------------------------
    def _command(self, op: str, kwargs: dict | list[dict], deadline_s: float | None = None) -> list[Any]:
        """Send ``op`` to every rank (one kwargs dict for all, or one per rank) and gather replies."""
        if not self._healthy:
            raise RuntimeError("the DDP workers are not running: call reset() first")
        per_rank = kwargs if isinstance(kwargs, list) else [kwargs] * len(self._conns)
        sent_failed: dict[int, str] = {}
        for rank, (conn, kw) in enumerate(zip(self._conns, per_rank, strict=True)):
            try:
                conn.send((op, kw))
            except (OSError, ValueError) as e:
                sent_failed[rank] = f"could not be sent the {op!r} command ({type(e).__name__})"
        return self._gather(op, deadline_s=deadline_s, sent_failed=sent_failed)

    def _gather(
        self, op: str, deadline_s: float | None, sent_failed: dict[int, str] | None = None
    ) -> list[Any]:
        n = len(self._conns)
        replies: dict[int, Any] = {}
        errors: dict[int, dict] = {}
        dead: dict[int, str] = {}
        pending = {r for r in range(n) if r not in (sent_failed or {})}
        start = time.monotonic()
        hard_deadline = start + (deadline_s if deadline_s is not None else math.inf)
        first_failure = time.monotonic() if sent_failed else None
        while pending:
            now = time.monotonic()
            limit = (
                hard_deadline
                if first_failure is None
                else min(hard_deadline, first_failure + FAILURE_GRACE_S)
            )
            if now >= limit:
                break
            waitables = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            ready = mp_wait(waitables, timeout=min(limit - now, 1.0))
            for r in sorted(pending):
                conn, proc = self._conns[r], self._procs[r]
                if conn in ready or conn.poll():
                    try:
                        status, payload = conn.recv()
                    except (EOFError, OSError):
                        proc.join(timeout=1.0)
                        dead[r] = f"died: {_exit_description(proc.exitcode)}"
                        pending.discard(r)
                        first_failure = first_failure or time.monotonic()
                        continue
                    pending.discard(r)
                    if status == "ok":
                        replies[r] = payload
                    else:
                        errors[r] = payload
                        first_failure = first_failure or time.monotonic()
                elif proc.sentinel in ready:
                    proc.join(timeout=1.0)
                    dead[r] = f"died: {_exit_description(proc.exitcode)}"
                    pending.discard(r)
                    first_failure = first_failure or time.monotonic()
        if not (errors or dead or pending or sent_failed):
            return [replies[r] for r in range(n)]
        self._fail(op, errors, dead, pending, sent_failed or {}, time.monotonic() - start)
        raise AssertionError("unreachable")  # pragma: no cover

    def _fail(
        self,
        op: str,
        errors: dict[int, dict],
        dead: dict[int, str],
        silent: set[int],
        sent_failed: dict[int, str],
        waited_s: float,
    ) -> None:
        """Describe the failure, kill and reap every worker, raise :class:`WorkerFailure`."""
        cfg = self.config
        parts: dict[int, str] = {}
        for r, why in sent_failed.items():
            proc = self._procs[r]
            proc.join(timeout=1.0)
            parts[r] = f"{why}; process {_exit_description(proc.exitcode)}"
        parts.update(dead)
        for r in silent:
            try:
                status = psutil.Process(self._procs[r].pid).status()
            except psutil.Error:
                status = "gone"
            parts[r] = (
                f"stopped responding: no reply within the collective timeout of {cfg.timeout_s:g} s "
                f"(waited {waited_s:.1f} s; process status: {status})"
            )
        culprits = sorted(set(dead) | set(silent) | set(sent_failed))
        for r, e in errors.items():
            parts[r] = f"raised {e['error']}"
        if not culprits:
            culprits = sorted(errors)
        rank = culprits[0]
        pid = self._pids[rank] if rank < len(self._pids) else "?"
        others = "; ".join(f"rank {r}: {parts[r]}" for r in sorted(parts) if r != rank)
        interval = getattr(self, "_intervals", 0)
        message = (
            f"DDP worker rank {rank} (pid {pid}) failed during {op!r} (interval {interval}): {parts[rank]}."
            + (f" Other ranks: {others}." if others else "")
            + f" All {len(self._procs)} worker processes were stopped; call reset() to start new ones."
        )
        if op == "start" and dead:
            # where the ranks re-import the main module (a config holding one of its objects, see
            # _main_not_reimported), an env built above its main guard kills them while starting
            message += (
                " A rank that dies while starting usually means the main script builds the env (or the"
                ' backend) outside `if __name__ == "__main__":`; the worker\'s traceback above says where.'
            )
        tb = errors.get(rank, {}).get("traceback")
        if tb:
            log.error("rank %d traceback:\n%s", rank, tb)
        self._shutdown(kill=True)
        self._reset_done = False
        raise WorkerFailure(message, rank)

    # --- the interval --------------------------------------------------------------------------------
    def wall_time_s(self) -> float:
        return self._wall_offset_s + (time.perf_counter() - self._t0)

    def _check_batches(self, local_batches: np.ndarray) -> np.ndarray:
        b = np.asarray(local_batches)
        n = self.spec.num_workers
        if b.shape != (n,):
            raise ValueError(f"local_batches must have shape ({n},), got {b.shape}")
        if not np.all(np.isfinite(b)) or np.any(b != np.round(b)):
            raise ValueError(f"local_batches must be whole numbers, got {b.tolist()}")
        b = b.astype(np.int64)
        bad = np.flatnonzero((b < self.spec.min_batch) | (b > self.spec.max_batch))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"local_batches[{i}] = {int(b[i])} is outside worker {i}'s allowed range "
                f"[{int(self.spec.min_batch[i])}, {int(self.spec.max_batch[i])}] (BackendSpec.max_batch "
                "is the memory cap)"
            )
        return b

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        if not self._reset_done:
            raise RuntimeError("DDPBackend.run_interval() called before reset() (or after a failure)")
        if isinstance(iterations, bool) or int(iterations) != iterations or iterations < 1:
            raise ValueError(f"iterations (K) must be an integer >= 1, got {iterations!r}")
        return self.guarded_interval(self._check_batches(local_batches), int(iterations))

    def _interval(self, b: np.ndarray, k_iters: int) -> IntervalReport:
        """One interval at the checked batches ``b`` (the guards' work is around it)."""
        cfg = self.config
        t_start = time.perf_counter()
        wall_start = self.wall_time_s()
        mono_start = time.monotonic()  # the workers' clock (system-wide) at wall_start
        faults = self.faults.interval(wall_start, b, k_iters, self._last_comm_s)
        b_run = np.where(faults.alive, b, 0)
        if not b_run.any():
            raise RuntimeError("every worker is lost: the scenario leaves no worker to train on")
        probe = bool(np.any(b_run > self._good))
        lr = {
            "rule": cfg.lr_rule,
            "base_lr": cfg.base_lr,
            "base_batch": cfg.base_batch,
            "noise_scale": self.noise.noise_scale,
            "multiplier": self.lr_multiplier * self.guard.lr_scale,  # elastic controller x guards' backoff
        }
        changed = self._last_batches is not None and bool(np.any(b != self._last_batches))
        common = {
            "batches": b_run.tolist(),
            "iterations": k_iters,
            "lr": lr,
            "net_delay_s": faults.net_delay_s,
            "probe": probe,
            "good": np.where(faults.alive, self._good, 0).tolist(),
        }
        kwargs = [
            {**common, "slowdown": float(faults.slowdown[r]),
             "slowdown_at": [(mono_start + dt, float(s[r])) for dt, s in faults.slowdown_changes]}
            for r in range(cfg.workers)
        ]  # fmt: skip
        snap0 = HostSnapshot.take()
        deadline = (k_iters + 1) * cfg.timeout_s + (cfg.start_timeout_s if self._intervals == 0 else 0.0)
        replies = self._command("interval", kwargs, deadline_s=deadline)
        snap1 = HostSnapshot.take()
        t_end = time.perf_counter()
        report = self._report(b, faults, replies, k_iters, t_end - t_start, changed, snap0, snap1)
        #: the learning rate of the interval's last iteration (every rank steps the same rates)
        self.last_lr = float(replies[0]["lr"])
        self._last_batches = b
        self._intervals += 1
        if self._intervals > self.lr_noise_warmup:  # counted from the run's start, also after a resume
            self.noise.update(report)
        self._last_comm_s = report.comm_time_s
        if cfg.checkpoint_every and self._intervals % cfg.checkpoint_every == 0:
            self.save_checkpoint()
        return report

    def _report(
        self,
        requested: np.ndarray,
        faults: Any,
        replies: list[dict],
        k_iters: int,
        interval_s: float,
        changed: bool,
        snap0: HostSnapshot,
        snap1: HostSnapshot,
    ) -> IntervalReport:
        n = self.spec.num_workers
        applied = np.asarray(replies[0]["batches"], dtype=np.int64)
        alive = faults.alive.copy()
        events = list(faults.events)
        for r in replies[0]["oom"]:
            events.append(
                f"out of memory on worker {r} at local batch {int(requested[r])}: "
                f"stepped back to its last good batch {int(applied[r])}"
            )
        # Raise the known-good batch of every rank that ran without running out of memory.
        self._good = np.where(alive & (applied > self._good), applied, self._good)
        local_batch = np.where(alive, applied, requested).astype(np.int64)
        compute = np.stack([r["compute_s"] for r in replies])  # (N, K)
        iters = np.stack([r["iter_s"] for r in replies])
        loss_sums = np.array([r["loss_sum"] for r in replies])
        if not np.all(np.isfinite(loss_sums)):
            raise TrainingDiverged(
                f"the training loss became {loss_sums.tolist()} (per rank) in interval {self._intervals}: "
                f"lower base_lr (now {self.config.base_lr}) or the lr_rule's gain"
            )
        gnorm = np.stack([np.sqrt(r["local_sqr"]) for r in replies])
        global_sqr = np.asarray(replies[0]["global_sqr"])
        if not (np.all(np.isfinite(gnorm)) and np.all(np.isfinite(global_sqr))):
            raise TrainingDiverged(
                f"the gradient norm became non-finite (per rank, largest: {gnorm.max(axis=1).tolist()}) in "
                f"interval {self._intervals}: lower base_lr (now {self.config.base_lr}) or the lr_rule's gain"
            )
        seconds, sent, retrans = snap0.delta(snap1)
        val_acc, val_loss = replies[0]["val"]
        if not math.isfinite(val_loss):
            raise TrainingDiverged(f"the validation loss became {val_loss} in interval {self._intervals}")
        samples = np.array([r["samples"] for r in replies], dtype=np.float64)
        out_of_range = self.config.task.diverged(
            float(val_loss), (loss_sums / np.maximum(samples, 1.0))[samples > 0].tolist()
        )
        if out_of_range:
            raise TrainingDiverged(
                f"{out_of_range} in interval {self._intervals}: lower base_lr (now {self.config.base_lr}) "
                "or the lr_rule's gain"
            )
        report = IntervalReport.from_rank_timings(
            local_batch=local_batch,
            alive=alive,
            compute_s=compute,
            wait_s=np.stack([r["wait_s"] for r in replies]),
            iteration_time_s=iters.mean(axis=1),
            iterations=k_iters,
            interval_time_s=float(interval_s),
            rank_samples=samples,
            correct=np.array([r["correct"] for r in replies]),
            loss_sum=loss_sums,
            grad_norm_mean=gnorm.mean(axis=1),
            grad_norm_var=gnorm.var(axis=1),
            local_grad_sqr=np.stack([r["local_sqr"] for r in replies]).mean(axis=1),
            net_bytes_per_s=np.full(n, sent / n / max(seconds, 1e-9)),
            tcp_retransmissions=np.full(n, retrans / n),
            cpu_util=np.array([r["cpu_util"] for r in replies]),
            mem_util=np.array([r["mem_util"] for r in replies]),
            # Device busy: local compute including emulated slowness (a slower device computes longer).
            gpu_util=np.clip(compute.sum(axis=1) / np.maximum(iters.sum(axis=1), 1e-12), 0.0, 1.0),
            gpu_mem_util=np.array([r["gpu_mem_util"] for r in replies]),
            wall_time_s=float(self.wall_time_s()),
            reconfig_time_s=float(max(r["setup_s"] for r in replies)) if changed else 0.0,
            global_grad_sqr=float(np.mean(global_sqr)),
            val_accuracy=float(val_acc),
            val_loss=float(val_loss),
            epoch=float(replies[0]["epoch"]),
            events=tuple(events),
        )
        self._samples += report.samples
        report.validate()
        self.last_replies = replies
        return report

    # --- inspection (tests, diagnostics) --------------------------------------------------------------
    def parameters(self) -> list[np.ndarray]:
        """Every rank's flattened parameters."""
        return self._command("parameters", {})

    def gradient(self, local_batches: list[int]) -> list[dict]:
        """Every rank's all-reduced gradient for one step at ``local_batches`` (no update)."""
        return self._command("gradient", {"batches": [int(x) for x in local_batches]})
