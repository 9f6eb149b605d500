"""Stage ranks of a real pipeline on CPU gloo (``torch.distributed.pipelining``).

A :class:`StagePool` spawns one process per stage and keeps them for as long as the partition and
the micro-batch count hold. Each rank joins a gloo group whose timeout bounds every point-to-point
send and receive, builds its stage from the blocks ``[cuts[r], cuts[r + 1])`` loaded by name from
the given state, and then obeys the coordinator's commands:

* ``run``: ``steps`` steps of ``Schedule1F1B`` (or ``ScheduleGPipe``) on scikit-learn's bundled
  digits (the step's batch drawn from the seed and the global step index, so the data order does
  not depend on the partition), every micro-batch's forward and backward timed (an emulated
  slow-down ``slow`` sleeps ``(slow - 1)`` times each, so the stage computes ``slow`` times
  longer), then the validation accuracy of the whole model, pipelined over the ranks;
* ``stop``: every block's state and optimiser state by name, and the rank exits.

The coordinator waits at most ``timeout_s`` for each answer; a rank that dies or does not answer
within it is named in a :class:`StageRankError`, and every rank process is terminated and joined
before the error is raised. :func:`run_stages` is one pool's start, run and stop.
"""

from __future__ import annotations

import datetime
import itertools
import os
import queue
import socket
import time
from typing import Any

#: Hidden width of the blocks of the digits model (the pool's default).
HIDDEN = 128
#: Digits rows used for training (the rest, 297 rows, are the validation set).
TRAIN_ROWS = 1500


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_blocks(num_blocks: int = 8, seed: int = 0, hidden: int = HIDDEN):
    """The digits model: ``num_blocks`` named blocks, ``b0`` 64 -> hidden (linear, ReLU), residual
    blocks ``h + relu(W h)`` (plain stacks of 8 such layers barely train under SGD), ``b{n-1}``
    hidden -> 10."""
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.lin = nn.Linear(width, width)

        def forward(self, h):
            return h + torch.relu(self.lin(h))

    torch.manual_seed(seed)
    blocks = {"b0": nn.Sequential(nn.Linear(64, hidden), nn.ReLU())}
    for i in range(1, num_blocks - 1):
        blocks[f"b{i}"] = Residual(hidden)
    blocks[f"b{num_blocks - 1}"] = nn.Sequential(nn.Linear(hidden, 10))
    return blocks


def check_cuts(cuts: list[int], num_blocks: int) -> None:
    if (
        len(cuts) < 3
        or cuts[0] != 0
        or cuts[-1] != num_blocks
        or any(b <= a for a, b in itertools.pairwise(cuts))
    ):
        raise ValueError(f"cuts must rise strictly from 0 to {num_blocks} over >= 2 stages, got {cuts}")


class StageRankError(RuntimeError):
    """A stage rank hung or died; ``ranks`` names which."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def _rank_main(rank: int, world: int, port: int, job: dict[str, Any], inbox, out) -> None:
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
        blocks = make_blocks(job["num_blocks"], job["seed"], job["hidden"])
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
        x = torch.tensor(x / 16.0, dtype=torch.float32)
        y = torch.tensor(y)
        x_val, y_val, x, y = x[TRAIN_ROWS:], y[TRAIN_ROWS:], x[:TRAIN_ROWS], y[:TRAIN_ROWS]
        slow, fwd_s, bwd_s = [1.0], [], []

        def timed(call, log):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                r = call(*a, **k)
                dt = time.perf_counter() - t0
                if slow[0] > 1.0:  # emulated interference: the stage computes ``slow`` times longer
                    time.sleep((slow[0] - 1.0) * dt)
                log.append(dt * slow[0])
                return r

            return wrapper

        # the schedule calls the stage's methods through the instance: time each micro-batch there
        stage.forward_one_chunk = timed(stage.forward_one_chunk, fwd_s)
        stage.backward_one_chunk = timed(stage.backward_one_chunk, bwd_s)

        def validate() -> float:  # the whole model's accuracy on the held-out rows, pipelined
            with torch.no_grad():
                h = x_val
                if rank > 0:
                    h = torch.empty(len(x_val), job["hidden"])
                    dist.recv(h, src=rank - 1)
                h = module(h)
                if rank < world - 1:
                    dist.send(h.contiguous(), dst=rank + 1)
                    return float("nan")
                return float((h.argmax(1) == y_val).float().mean())

        out.put((rank, "ready", {"ready_s": time.perf_counter() - t_start}))
        while True:
            cmd, arg = inbox.get()
            if cmd == "run":
                slow[0] = float(arg["slowdown"][rank])
                fwd_s.clear()
                bwd_s.clear()
                step_s = []
                for step in range(arg["steps"]):
                    g = torch.Generator().manual_seed(job["seed"] * 100_003 + arg["first_step"] + step)
                    idx = torch.randint(0, len(x), (job["batch"],), generator=g)
                    opt.zero_grad()
                    t0 = time.perf_counter()
                    if rank == 0:
                        sched.step(x[idx])
                    else:
                        sched.step(target=y[idx])
                    opt.step()
                    step_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                acc = validate()
                out.put((rank, "ran", {"step_s": step_s, "fwd_s": list(fwd_s), "bwd_s": list(bwd_s),
                                       "val_accuracy": acc, "val_s": time.perf_counter() - t0}))  # fmt: skip
            elif cmd == "stop":
                # numpy across the queue: torch's shared-memory tensors die with the rank that sent them
                state = {
                    n: {k: v.detach().numpy().copy() for k, v in blocks[n].state_dict().items()} for n in mine
                }
                optim = {
                    f"{n}.{pname}": opt.state[p]["momentum_buffer"].numpy().copy()
                    for n in mine
                    for pname, p in blocks[n].named_parameters()
                    if "momentum_buffer" in opt.state.get(p, {})
                }
                dist.destroy_process_group()
                out.put((rank, "stopped", {"state": state, "optim": optim}))
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
    except Exception as e:  # reported, then the process exits: the coordinator names the rank
        out.put((rank, "error", repr(e)))


class StagePool:
    """Live stage ranks of one partition ``cuts`` at ``micro_batches`` micro-batches (module docstring).

    ``batch`` samples per step, split into ``micro_batches`` micro-batches; ``state`` / ``optim``:
    the blocks' parameters and momentum by name (``None``: fresh from ``seed``); ``timeout_s``
    bounds every wait, the start included.
    """

    def __init__(
        self,
        cuts: list[int],
        *,
        micro_batches: int = 4,
        batch: int = 64,
        state: dict | None = None,
        optim: dict | None = None,
        schedule: str = "1f1b",
        num_blocks: int = 8,
        hidden: int = HIDDEN,
        seed: int = 0,
        lr: float = 0.05,
        timeout_s: float = 60.0,
    ) -> None:
        import multiprocessing as mp

        check_cuts(list(cuts), num_blocks)
        if batch % micro_batches:
            raise ValueError(f"batch ({batch}) must be a multiple of micro_batches ({micro_batches})")
        self.cuts, self.world, self.timeout_s = list(cuts), len(cuts) - 1, float(timeout_s)
        job = dict(cuts=self.cuts, micro_batches=micro_batches, batch=batch, state=state, optim=optim,
                   schedule=schedule, num_blocks=num_blocks, hidden=hidden, seed=seed, lr=lr,
                   timeout_s=timeout_s)  # fmt: skip
        ctx = mp.get_context("spawn")
        self._out = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world)]
        port = free_port()
        t0 = time.perf_counter()
        self._procs = [
            ctx.Process(target=_rank_main, args=(r, self.world, port, job, self._inboxes[r], self._out), daemon=True)
            for r in range(self.world)
        ]  # fmt: skip
        for p in self._procs:
            p.start()
        self.ready_s = [a["ready_s"] for a in self._collect("ready")]
        self.start_s = time.perf_counter() - t0

    def run(self, steps: int, *, first_step: int, slowdown: list[float] | None = None) -> list[dict]:
        """``steps`` steps from global step ``first_step``; each rank's timings and the accuracy."""
        slowdown = list(slowdown or [1.0] * self.world)
        if len(slowdown) != self.world or min(slowdown) < 1.0:
            raise ValueError(f"slowdown must hold {self.world} factors >= 1, got {slowdown}")
        for box in self._inboxes:
            box.put(("run", {"steps": int(steps), "first_step": int(first_step), "slowdown": slowdown}))
        return self._collect("ran")

    def stop(self) -> tuple[dict, dict]:
        """Every block's state and momentum by name; the ranks exit."""
        for box in self._inboxes:
            box.put(("stop", None))
        answers = self._collect("stopped")
        self.close()
        state = {k: v for a in answers for k, v in a["state"].items()}
        optim = {k: v for a in answers for k, v in a["optim"].items()}
        return state, optim

    def close(self) -> None:
        """Terminate and join every rank process (idempotent)."""
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)

    def _collect(self, expect: str) -> list[dict]:
        """Each rank's ``expect`` answer within ``timeout_s``; else close and name the missing ranks."""
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.perf_counter() + self.timeout_s
        while len(results) + len(errors) < self.world:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                rank, status, payload = self._out.get(timeout=min(left, 1.0))
            except queue.Empty:
                for r, p in enumerate(self._procs):
                    if not p.is_alive() and r not in results and r not in errors:
                        errors[r] = f"exited with code {p.exitcode} without reporting"
                continue
            if status == expect:
                results[rank] = payload
            else:
                errors[rank] = payload if status == "error" else f"answered {status!r}, not {expect!r}"
        missing = [r for r in range(self.world) if r not in results]
        if missing:
            self.close()
            why = "; ".join(
                f"rank {r}: {errors.get(r, f'no answer within {self.timeout_s:g} s (hung)')}" for r in missing
            )
            raise StageRankError(f"pipeline stage ranks failed ({expect}): {why}", missing)
        return [results[r] for r in range(self.world)]

    def __enter__(self) -> StagePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_stages(
    cuts: list[int],
    *,
    steps: int,
    slowdown: list[float] | None = None,
    first_step: int = 0,
    **pool: Any,
) -> dict[str, Any]:
    """One pool's start, ``steps`` steps from ``first_step`` and stop (``pool``: :class:`StagePool`'s
    keywords): the timings, the accuracy, and every block's state and momentum by name."""
    check_cuts(list(cuts), int(pool.get("num_blocks", 8)))
    t0 = time.perf_counter()
    with StagePool(cuts, **pool) as stages:
        ran = stages.run(steps, first_step=first_step, slowdown=slowdown)
        new_state, new_optim = stages.stop()
    return {
        "wall_s": time.perf_counter() - t0,
        "ready_s": stages.ready_s,
        "step_s": [a["step_s"] for a in ran],
        "fwd_busy_s": [sum(a["fwd_s"]) for a in ran],
        "bwd_busy_s": [sum(a["bwd_s"]) for a in ran],
        "val_accuracy": ran[-1]["val_accuracy"],
        "state": new_state,
        "optim": new_optim,
    }
