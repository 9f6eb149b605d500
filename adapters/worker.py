"""The worker processes of the DDP backend: one persistent process per rank, commanded over a pipe.

Each worker joins one torch.distributed process group (the coordinator holds the rendezvous
``TCPStore``), wraps its model in ``DistributedDataParallel`` with the measuring comm hook
(:mod:`adapters.hooks`), and then serves commands from the coordinator (``adapters.ddp_backend``)
until told to stop or until the coordinator goes away (its pipe closes, or - on Linux - the kernel
kills the worker with its parent). Every rank receives the same command (the same batches, learning
rate and fault schedule), so every rank enters the same collectives: no rank waits on a collective
that another skips.

A command is ``(op, kwargs)``; the reply is ``("ok", result)`` or ``("error", details)``, after which
the worker exits.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import traceback
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from adapters.checkpoint import atomic_torch_save, load
from adapters.config import RealDDPConfig
from adapters.data import load_dataset
from adapters.hooks import GradStats, grad_stats_hook
from adapters.hostmetrics import ProcessMeter
from adapters.models import build_model
from adapters.sampling import GlobalBatchSchedule, loss_weight, rank_slice
from adapters.snapshot import StateSnapshot
from sim.guards import LRRamp
from sim.scaling import lr_gain

#: One all-reduce bucket for the whole gradient: compute and waiting are then measured separately
#: (the hook on the last bucket marks the end of local compute). Larger models get several buckets.
BUCKET_CAP_MB = 256
VAL_CHUNK = 1024
#: The process-group timeout is this much shorter than the configured one, so that the
#: coordinator can name the failed rank within the configured timeout.
TIMEOUT_MARGIN_S = 2.0


def process_group_timeout_s(timeout_s: float) -> float:
    return max(timeout_s - min(TIMEOUT_MARGIN_S, 0.2 * timeout_s), 0.5 * timeout_s)


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when its parent dies (no orphans)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def worker_main(rank: int, cfg: RealDDPConfig, conn: Any, store_port: int, seed: int) -> None:
    """Entry point of a worker process (importable, for the ``spawn`` start method)."""
    _die_with_parent()
    torch.set_num_threads(cfg.threads_per_worker)
    trainer = None
    try:
        store = dist.TCPStore("127.0.0.1", store_port, None, False, timedelta(seconds=cfg.start_timeout_s))
        dist.init_process_group(
            cfg.dist_backend,
            store=store,
            rank=rank,
            world_size=cfg.workers,
            timeout=timedelta(seconds=process_group_timeout_s(cfg.timeout_s)),
        )
        trainer = Trainer(rank, cfg, seed)
        conn.send(("ok", {"pid": os.getpid(), "train_size": trainer.data.train_size}))
        while True:
            try:
                op, kwargs = conn.recv()
            except (EOFError, OSError):
                break  # the coordinator is gone
            if op == "stop":
                break
            result = getattr(trainer, f"op_{op}")(**kwargs)
            conn.send(("ok", result))
    except BaseException as e:  # report, then leave without running destructors that may hang
        try:
            conn.send(
                (
                    "error",
                    {"rank": rank, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()},
                )
            )
            conn.close()
        finally:
            os._exit(1)
    # Clean stop: free the model and optimiser before destroying the group, then leave at once
    # (avoids the rare "terminate called without an active exception" at interpreter exit).
    del trainer
    gc.collect()
    try:
        dist.destroy_process_group()
    finally:
        os._exit(0)


class Trainer:
    """One rank's model, optimiser, data walk and measurement state."""

    def __init__(self, rank: int, cfg: RealDDPConfig, seed: int) -> None:
        self.rank = rank
        self.cfg = cfg
        self.world = cfg.workers
        self.cuda = cfg.device == "cuda"
        if self.cuda:
            self.device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        data = load_dataset(cfg.dataset, val_fraction=cfg.val_fraction, split_seed=cfg.split_seed)
        self.data = data
        self.task = cfg.task  # loss, count and validation (adapters.tasks)
        self.x_train, self.y_train = data.x_train.to(self.device), data.y_train.to(self.device)
        self.x_val, self.y_val = data.x_val.to(self.device), data.y_val.to(self.device)
        self.meter = ProcessMeter(ranks_on_host=self.world)
        self._build(seed)

    # --- construction -------------------------------------------------------------------------------
    def _build(self, seed: int) -> None:
        cfg = self.cfg
        torch.manual_seed(seed)
        model = build_model(cfg.model, self.data.input_shape, self.data.num_classes, norm=cfg.norm)
        model = model.to(self.device)
        self.ddp = DDP(
            model,
            device_ids=[self.device.index] if self.cuda else None,
            bucket_cap_mb=BUCKET_CAP_MB,
        )
        self.stats = GradStats(world_size=self.world, cuda=self.cuda)
        self.ddp.register_comm_hook(self.stats, grad_stats_hook)
        self.opt = torch.optim.SGD(
            self.ddp.parameters(), lr=cfg.base_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        self.schedule = GlobalBatchSchedule(self.data.train_size, seed)
        self.ramp = LRRamp(self.cfg.guards.ramp_iters())
        self.snapshot = StateSnapshot()

    def _set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def op_reset(self, seed: int) -> dict:
        """A fresh run (new model, optimiser and data walk) without respawning."""
        del self.ddp, self.opt
        gc.collect()
        self._build(seed)
        return {}

    # --- one interval ------------------------------------------------------------------------------
    def _probe(self, batches: np.ndarray, good: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Try this rank's new batch locally (no collective inside); agree on who ran out of memory.

        Ranks that fail fall back to their last good batch; every rank applies the same fallback.
        """
        b = int(batches[self.rank])
        failed = 0.0
        try:
            cap = self.cfg.memory_batch
            if cap is not None and b > cap[self.rank]:
                raise torch.OutOfMemoryError(
                    f"emulated: local batch {b} exceeds rank {self.rank}'s memory cap of {cap[self.rank]}"
                )
            with self.ddp.no_sync():
                out = self.ddp(self.x_train[:b])
                self.task.loss_sum(out, self.y_train[:b]).backward()
        except torch.OutOfMemoryError:
            failed = 1.0
            if self.cuda:
                torch.cuda.empty_cache()
        finally:
            self.opt.zero_grad(set_to_none=True)
        flags = torch.zeros(self.world, device=self.device)
        flags[self.rank] = failed
        dist.all_reduce(flags)
        bad = [int(i) for i in torch.nonzero(flags).flatten().tolist()]
        out_b = batches.copy()
        out_b[bad] = good[bad]
        return out_b, bad

    def op_interval(
        self,
        batches: list[int],
        iterations: int,
        lr: dict,
        slowdown: float,
        net_delay_s: np.ndarray,
        probe: bool,
        good: list[int],
        validate: bool = True,
        slowdown_at: list[tuple[float, float]] = (),
    ) -> dict:
        t_setup = time.perf_counter()
        b_all = np.asarray(batches, dtype=np.int64)
        oom: list[int] = []
        if probe:
            b_all, oom = self._probe(b_all, np.asarray(good, dtype=np.int64))
        # The learning rate follows the batches actually applied (after any out-of-memory step-back),
        # its gain capped by the guards and ramped to over their iterations (sim.guards).
        gain = self.cfg.guards.lr_gain(
            lr_gain(lr["rule"], int(b_all.sum()), lr["base_batch"], lr["noise_scale"])
        )
        self.ramp.set_target(
            lr["base_lr"] * lr.get("multiplier", 1.0) * gain, int(b_all.sum())
        )  # an elastic controller's
        lrs = self.ramp.steps(int(iterations))
        self._set_lr(lrs[0])
        setup_s = time.perf_counter() - t_setup

        k_iters = int(iterations)
        big_b = int(b_all.sum())
        weight = loss_weight(b_all)
        sl = rank_slice(b_all, self.rank)
        b = int(b_all[self.rank])
        # Squared local gradient norm from the hook's raw (weighted, summed-loss) buckets:
        # raw = (W / B) * b * g_local  =>  |g_local|^2 = raw_sqr * (B / (W b))^2.
        to_local = (big_b / (self.world * b)) ** 2 if b > 0 else 0.0
        compute = np.zeros(k_iters)
        wait = np.zeros(k_iters)
        iter_s = np.zeros(k_iters)
        injected = np.zeros(k_iters)
        local_sqr = np.zeros(k_iters)
        global_sqr = np.zeros(k_iters)
        correct = self.task.zero_count(self.device)
        loss_sum = torch.zeros((), device=self.device)
        indices = [] if self.cfg.record_indices else None
        stats, model, opt = self.stats, self.ddp, self.opt
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.meter.mark()
        changes = [(float(t), float(f)) for t, f in slowdown_at]  # (time.monotonic(), factor), in order
        for k in range(k_iters):
            if lrs[k] != lrs[k - 1]:  # during a ramp (k = 0 was set above)
                self._set_lr(lrs[k])
            while changes and time.monotonic() >= changes[0][0]:  # a compute fault began or ended
                slowdown = changes.pop(0)[1]
            stats.begin(slowdown)
            t0 = stats.t_start
            idx = self.schedule.next_global(big_b)
            mine = torch.from_numpy(idx[sl]).to(self.device)
            if indices is not None:
                indices.append(idx[sl].copy())
            x, y = self.x_train[mine], self.y_train[mine]
            out = model(x)
            loss = self.task.loss_sum(out, y)
            (loss * weight).backward()
            t_bw = time.perf_counter()
            stats.finish()
            if net_delay_s[k] > 0:
                time.sleep(float(net_delay_s[k]))
            t_net = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                correct += self.task.count(out, y, loss)
                loss_sum += loss.detach()
            if self.cuda:
                torch.cuda.synchronize()
            t_end = time.perf_counter()
            t_ready = stats.t_ready or t_bw
            compute[k] = (t_ready - t0) + stats.injected_s + (t_end - t_net)
            wait[k] = max(t_bw - t_ready - stats.injected_s, 0.0) + (t_net - t_bw)
            iter_s[k] = t_end - t0
            injected[k] = stats.injected_s
            local_sqr[k] = stats.local_sqr * to_local
            global_sqr[k] = stats.global_sqr
        # Emulated slowness is time the (slower) device spends computing: on a CPU device that is
        # CPU time (the simulator's counters for a profile measured on CPUs count it so too).
        cpu_util, mem_util = self.meter.read(extra_busy_s=0.0 if self.cuda else float(injected.sum()))
        reply: dict[str, Any] = {
            "batches": b_all.tolist(),
            "oom": oom,
            "setup_s": setup_s,
            "compute_s": compute,
            "wait_s": wait,
            "iter_s": iter_s,
            "injected_s": injected,
            "local_sqr": local_sqr,
            "global_sqr": global_sqr,
            "correct": correct.item(),
            "loss_sum": float(loss_sum),
            "samples": b * k_iters,
            "cpu_util": cpu_util,
            "mem_util": mem_util,
            "gpu_mem_util": self._gpu_mem_util(),
            "epoch": self.schedule.epochs_done,
            "lr": lrs[-1],
        }
        if indices is not None:
            reply["indices"] = indices
        if validate and self.rank == 0:
            reply["val"] = self.validate()
        return reply

    def _gpu_mem_util(self) -> float:
        if not self.cuda:
            return 0.0
        total = torch.cuda.get_device_properties(self.device).total_memory
        return float(torch.cuda.max_memory_allocated(self.device) / total)

    def validate(self) -> tuple[float, float]:
        """(quality, mean loss) on the held-out split: the task's (accuracy and cross-entropy for
        classification; see :mod:`adapters.tasks`)."""
        module = self.ddp.module
        module.eval()
        result = self.task.validate(module, self.x_val, self.y_val, VAL_CHUNK)
        module.train()
        return result

    # --- checkpoints and inspection ----------------------------------------------------------------
    def op_checkpoint(self, path: str) -> dict:
        if self.rank == 0:
            atomic_torch_save(self._state(), path)
        return {}

    def op_load(self, path: str) -> dict:
        self._load_state(load(path))
        return {}

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.ddp.module.state_dict(),
            "optimizer": self.opt.state_dict(),
            "schedule": self.schedule.state_dict(),
            "ramp": self.ramp.state_dict(),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self.ddp.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        if "ramp" in state:  # checkpoints written before the guards hold none
            self.ramp.load_state_dict(state["ramp"])

    def op_snapshot(self) -> dict:
        """Keep this rank's training state in memory (the guards' last good state; replicas agree,
        so every rank keeps its own copy and a rollback moves no data between ranks)."""
        self.snapshot.save(self._state())
        return {}

    def op_restore(self) -> dict:
        """Go back to the last :meth:`op_snapshot` (the guards' rollback)."""
        self._load_state(self.snapshot.load())
        return {}

    def op_parameters(self) -> np.ndarray:
        """This rank's parameters, flattened (tests: replicas agree; resume reproduces a run)."""
        return torch.cat([p.detach().flatten().cpu() for p in self.ddp.module.parameters()]).numpy()

    def op_gradient(self, batches: list[int]) -> dict:
        """One forward/backward at ``batches`` on the next global batch, no optimiser step: this
        rank's all-reduced gradient, the global batch's indices and the weights it was taken at."""
        b_all = np.asarray(batches, dtype=np.int64)
        state = {k: v.detach().cpu().clone() for k, v in self.ddp.module.state_dict().items()}
        idx = self.schedule.next_global(int(b_all.sum()))
        mine = torch.from_numpy(idx[rank_slice(b_all, self.rank)]).to(self.device)
        self.stats.begin()
        out = self.ddp(self.x_train[mine])
        (self.task.loss_sum(out, self.y_train[mine]) * loss_weight(b_all)).backward()
        grad = torch.cat([p.grad.detach().flatten().cpu() for p in self.ddp.module.parameters()]).numpy()
        self.opt.zero_grad(set_to_none=True)
        return {"gradient": grad, "indices": idx, "state": state}
