"""Stage ranks of a real pipeline on CPU gloo (``torch.distributed.pipelining``).

:func:`run_stages` spawns one process per stage; each joins a gloo group whose timeout bounds
every point-to-point send and receive, builds its stage from the blocks ``[cuts[r], cuts[r + 1])``
loaded by name from the given state, trains ``steps`` steps of ``Schedule1F1B`` (or
``ScheduleGPipe``) on scikit-learn's bundled digits, and returns its timings and its blocks' state
and optimiser state by name. The coordinator waits at most ``timeout_s`` for every rank; a rank
that dies or does not report within it is named in a :class:`StageRankError`, and every rank
process is terminated and joined before the error is raised.
"""

from __future__ import annotations

import datetime
import itertools
import os
import queue
import socket
import time
from typing import Any

#: Hidden width of the blocks of the digits model.
HIDDEN = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_blocks(num_blocks: int = 8, seed: int = 0):
    """The digits model: ``num_blocks`` named blocks, 64 -> HIDDEN ... -> 10 (ReLU between)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    dims = [64] + [HIDDEN] * (num_blocks - 1) + [10]
    blocks = {}
    for i in range(num_blocks):
        lin = nn.Linear(dims[i], dims[i + 1])
        blocks[f"b{i}"] = nn.Sequential(lin, nn.ReLU()) if i < num_blocks - 1 else nn.Sequential(lin)
    return blocks


class StageRankError(RuntimeError):
    """A stage rank hung or died; ``ranks`` names which."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def _rank_main(rank: int, world: int, port: int, job: dict[str, Any], out) -> None:
    t_start = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist
        from sklearn.datasets import load_digits
        from torch import nn
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=job["timeout_s"])
        )
        cuts, names = job["cuts"], [f"b{i}" for i in range(job["num_blocks"])]
        mine = names[cuts[rank] : cuts[rank + 1]]
        blocks = make_blocks(job["num_blocks"], job["seed"])
        for n in mine:
            if job["state"] is not None:
                blocks[n].load_state_dict({k: torch.from_numpy(v) for k, v in job["state"][n].items()})
        module = nn.Sequential(*(blocks[n] for n in mine))
        opt = torch.optim.SGD(module.parameters(), lr=job["lr"], momentum=0.9)
        if job["optim"] is not None:  # momentum buffers by block name and parameter
            for n in mine:
                for pname, p in blocks[n].named_parameters():
                    buf = job["optim"].get(f"{n}.{pname}")
                    if buf is not None:
                        opt.state[p]["momentum_buffer"] = torch.from_numpy(buf.copy())
        stage = PipelineStage(module, rank, world, torch.device("cpu"))
        kind = Schedule1F1B if job["schedule"] == "1f1b" else ScheduleGPipe
        sched = kind(stage, n_microbatches=job["micro_batches"], loss_fn=nn.CrossEntropyLoss())
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x[:1500] / 16.0, dtype=torch.float32)
        y = torch.tensor(y[:1500])
        slow = float(job["slowdown"][rank])
        busy = [0.0]

        def pre(_m, _a):
            busy.append(time.perf_counter())

        def post(_m, _a, _o):
            dt = time.perf_counter() - busy.pop()
            if slow > 1.0:  # emulated interference: the stage computes ``slow`` times longer
                time.sleep((slow - 1.0) * dt)
            busy[0] += dt * slow

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        ready = time.perf_counter() - t_start
        step_s = []
        for step in range(job["steps"]):
            g = torch.Generator().manual_seed(job["seed"] * 100_003 + job["first_step"] + step)
            idx = torch.randint(0, len(x), (job["batch"],), generator=g)
            opt.zero_grad()
            t0 = time.perf_counter()
            if rank == 0:
                sched.step(x[idx])
            else:
                sched.step(target=y[idx])
            opt.step()
            step_s.append(time.perf_counter() - t0)
        # numpy across the queue: torch's shared-memory tensors die with the rank that sent them
        state = {n: {k: v.detach().numpy().copy() for k, v in blocks[n].state_dict().items()} for n in mine}
        optim = {
            f"{n}.{pname}": opt.state[p]["momentum_buffer"].numpy().copy()
            for n in mine
            for pname, p in blocks[n].named_parameters()
            if "momentum_buffer" in opt.state.get(p, {})
        }
        dist.destroy_process_group()
        out.put(
            (
                rank,
                "ok",
                {"ready_s": ready, "step_s": step_s, "fwd_busy_s": busy[0], "state": state, "optim": optim},
            )
        )
    except Exception as e:  # reported, then the process exits: the coordinator names the rank
        out.put((rank, "error", repr(e)))


def run_stages(
    cuts: list[int],
    *,
    steps: int,
    micro_batches: int = 4,
    batch: int = 64,
    state: dict | None = None,
    optim: dict | None = None,
    slowdown: list[float] | None = None,
    schedule: str = "1f1b",
    num_blocks: int = 8,
    seed: int = 0,
    first_step: int = 0,
    lr: float = 0.05,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Run ``steps`` steps on the stage ranks of ``cuts`` (see the module docstring)."""
    import multiprocessing as mp

    world = len(cuts) - 1
    if (
        world < 2
        or cuts[0] != 0
        or cuts[-1] != num_blocks
        or any(b <= a for a, b in itertools.pairwise(cuts))
    ):
        raise ValueError(f"cuts must rise strictly from 0 to {num_blocks} over >= 2 stages, got {cuts}")
    job = dict(cuts=cuts, steps=steps, micro_batches=micro_batches, batch=batch, state=state, optim=optim,
               slowdown=slowdown or [1.0] * world, schedule=schedule, num_blocks=num_blocks, seed=seed,
               first_step=first_step, lr=lr, timeout_s=timeout_s)  # fmt: skip
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    t0 = time.perf_counter()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, job, out), daemon=True) for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = t0 + timeout_s
    try:
        while len(results) + len(errors) < world:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                rank, status, payload = out.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [
                    r
                    for r, p in enumerate(procs)
                    if not p.is_alive() and r not in results and r not in errors
                ]
                for r in dead:
                    errors[r] = f"exited with code {procs[r].exitcode} without reporting"
                continue
            (results if status == "ok" else errors)[rank] = payload
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
    missing = [r for r in range(world) if r not in results]
    if missing:
        why = "; ".join(
            f"rank {r}: {errors.get(r, f'no report within {timeout_s:g} s (hung)')}" for r in missing
        )
        raise StageRankError(f"pipeline stage ranks failed: {why}", missing)
    wall = time.perf_counter() - t0
    merged_state = {k: v for r in range(world) for k, v in results[r]["state"].items()}
    merged_optim = {k: v for r in range(world) for k, v in results[r]["optim"].items()}
    return {
        "wall_s": wall,
        "ready_s": [results[r]["ready_s"] for r in range(world)],
        "step_s": [results[r]["step_s"] for r in range(world)],
        "fwd_busy_s": [results[r]["fwd_busy_s"] for r in range(world)],
        "state": merged_state,
        "optim": merged_optim,
    }
