"""The controller-overhead benchmark's rank process (importable for ``spawn``).

Each rank trains four identical DDP replicas of the same model at the same fixed local batches,
alternating segments of ``iterations`` steps: plain DDP (torch's built-in all-reduce), plain DDP
with torch's Python all-reduce comm hook, the same loop with
:class:`~adapters.torchrun.DynamixController` (comm hook, per-iteration measurement, a decision
every K steps: gather, policy, broadcast) and its guards as configured (``cfg["guards"]``, default
on: the watchdog and a snapshot after every healthy interval), and the controller with its guards
off, so that the guards' own cost when nothing fires is measured side by side too. Every loop
validates at the same cadence, so only the controller's own work differs. Each segment's time is
the slowest rank's.

``cfg["device"]`` (default ``cpu``) places every rank's model and data; with ``cuda`` all ranks
share GPU 0 over gloo (NCCL refuses two ranks on one device) and each segment ends with a device
synchronisation, so queued kernels are inside the time they belong to.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from scipy import stats
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from adapters.data import load_dataset
from adapters.models import build_model
from adapters.sampling import GlobalBatchSchedule, loss_weight, rank_slice


def bench_rank(rank: int, world: int, port: int, cfg: dict, conn) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    from adapters.torchrun import DynamixController  # after the group exists

    device = torch.device(cfg.get("device", "cpu"))
    cuda = device.type == "cuda"
    if cuda:
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    data = load_dataset(cfg["dataset"])
    data = replace(
        data,
        x_train=data.x_train.to(device),
        y_train=data.y_train.to(device),
        x_val=data.x_val.to(device),
        y_val=data.y_val.to(device),
    )
    k, n_iter, batch = int(cfg["interval"]), int(cfg["iterations"]), int(cfg["batch"])
    batches = [batch] * world

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def make() -> tuple[DDP, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = DDP(build_model(cfg["model"], data.input_shape, data.num_classes).to(device))
        return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    plain, plain_opt = make()
    hooked, hooked_opt = make()  # plain DDP with torch's Python all-reduce hook (no measurement)
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    ctl_model, ctl_opt = make()

    def evaluator(model: DDP):
        def evaluate() -> tuple[float, float]:
            with torch.no_grad():
                out = model.module(data.x_val)
                return float((out.argmax(1) == data.y_val).float().mean()), float(
                    F.cross_entropy(out, data.y_val)
                )

        return evaluate

    bare_model, bare_opt = make()

    def controller(model: DDP, opt: torch.optim.Optimizer, guards) -> DynamixController:
        return DynamixController(
            model,
            opt,
            policy=cfg["policy"],
            interval=k,
            base_batch=batch,
            initial_batch=batch,
            lr_rule="none",
            evaluate=evaluator(model),
            min_batch=batch,
            max_batch=batch,
            guards=guards,
        )

    ctl = controller(ctl_model, ctl_opt, cfg.get("guards"))
    bare = controller(bare_model, bare_opt, "off")  # the same controller, guards off
    sched_plain = GlobalBatchSchedule(data.train_size, 0)
    sched_ctl = ctl.batch_sampler(data.train_size, seed=0).schedule
    sched_bare = bare.batch_sampler(data.train_size, seed=0).schedule

    def run_plain(model: DDP = plain, opt: torch.optim.Optimizer = plain_opt) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        w = loss_weight(batches)
        evaluate = evaluator(model)
        for it in range(n_iter):
            idx = torch.from_numpy(sched_plain.next_global(sum(batches))[rank_slice(batches, rank)])
            x, y = data.x_train[idx], data.y_train[idx]
            out = model(x)
            loss = F.cross_entropy(out, y, reduction="sum")
            (loss * w).backward()
            opt.step()
            opt.zero_grad()
            _ = (loss.detach(), (out.argmax(1) == y).sum())
            if (it + 1) % k == 0:
                evaluate()
        sync()
        return _slowest(time.perf_counter() - t0)

    def run_ctl(ctl=ctl, model=ctl_model, opt=ctl_opt, sched=sched_ctl) -> tuple[float, float]:
        dist.barrier()
        t0 = time.perf_counter()
        over0 = ctl.overhead_s
        for _ in range(n_iter):
            ctl.begin()
            b = ctl.batches.tolist()
            idx = torch.from_numpy(sched.next_global(sum(b))[rank_slice(b, rank)])
            x, y = data.x_train[idx], data.y_train[idx]
            out = model(x)
            loss = F.cross_entropy(out, y, reduction="sum")
            (loss * ctl.loss_scale).backward()
            opt.step()
            opt.zero_grad()
            ctl.end(loss.detach(), (out.argmax(1) == y).sum())
        sync()
        return _slowest(time.perf_counter() - t0), _slowest(ctl.overhead_s - over0)

    def run_bare() -> float:
        return run_ctl(bare, bare_model, bare_opt, sched_bare)[0]

    run_plain(), run_plain(hooked, hooked_opt), run_ctl(), run_bare()  # warm-up: bucket rebuilds, caches
    rows = []
    for r in range(int(cfg["rounds"])):
        if r % 2 == 0:
            tp = run_plain()
            th = run_plain(hooked, hooked_opt)
            tc, over = run_ctl()
            tb = run_bare()
        else:
            tb = run_bare()
            tc, over = run_ctl()
            th = run_plain(hooked, hooked_opt)
            tp = run_plain()
        rows.append((tp, tc, over, th, tb))
    if rank == 0:
        conn.send(
            {
                "rows": rows,
                "batches": ctl.batches.tolist(),
                "decisions": ctl.decisions,
                "timings": ctl.timings,
                "guard": ctl.guard.summary(),
            }
        )
    else:
        print("rank", rank, "timings", ctl.timings, "decisions", ctl.decisions, flush=True)
    plain = hooked = ctl_model = ctl = plain_opt = hooked_opt = ctl_opt = bare = bare_model = bare_opt = None
    gc.collect()
    dist.destroy_process_group()
    os._exit(0)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _ratio_of_totals(tc: np.ndarray, tp: np.ndarray, axis: int = -1) -> np.ndarray:
    return tc.sum(axis=axis) / tp.sum(axis=axis)


def _paired_ci(a: np.ndarray, b: np.ndarray, seed: int) -> list[float]:
    """95% bootstrap interval of sum(a) / sum(b) over rounds (paired)."""
    if len(a) < 3:
        return [float("nan"), float("nan")]
    boot = stats.bootstrap(
        (a, b),
        _ratio_of_totals,
        paired=True,
        vectorized=True,
        n_resamples=2000,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return [float(boot.confidence_interval.low), float(boot.confidence_interval.high)]


def summarise(rows: list[tuple[float, ...]], seed: int = 0) -> dict:
    arr = np.asarray(rows)
    tp, tc, over, th = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
    # Rounds are the unit of resampling (each pairs a plain and a controller segment run back to
    # back), so the interval reflects the round-to-round load noise of the machine.
    guards = {}
    if arr.shape[1] > 4:  # the controller with its guards off beside it
        tb = arr[:, 4]
        guards = {
            "guards_off_s": tb.tolist(),
            "guard_ratio_total": float(tc.sum() / tb.sum()),
            "guard_ratio_total_ci95": _paired_ci(tc, tb, seed),
            "guard_ratio_median": float(np.median(tc / tb)),
        }
    return {
        **guards,
        "ratio_total_ci95": _paired_ci(tc, tp, seed),
        "plain_hook_s": th.tolist(),
        "ratio_vs_hook_total": float(tc.sum() / th.sum()),
        "plain_s": tp.tolist(),
        "controller_s": tc.tolist(),
        "controller_self_s": over.tolist(),
        "ratio_total": float(tc.sum() / tp.sum()),
        # Least-disturbed segments: robust to other load on a shared machine.
        "ratio_min": float(tc.min() / tp.min()),
        "ratio_median": float(np.median(tc / tp)),
        "self_fraction": float(over.sum() / tc.sum()),
    }
