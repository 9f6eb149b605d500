"""A DDP script with DYNAMIX's drop-in controller that survives torch.distributed.elastic restarts.

    # one agent, room for a second one to join, 3 restarts allowed after failures:
    torchrun --nnodes=1:2 --nproc-per-node=1 --max-restarts=3 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=job1 --rdzv-conf=last_call_timeout=1 \
        adapters/examples/torchrun_elastic.py --checkpoint-dir /tmp/job1
    # a rank added: start a second agent with the same command; the group restarts at 2 ranks
    # a rank killed: kill -9 one worker; the agent restarts the group from the last checkpoint

Set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for the agents when nodes may join: with the shared
TCPStore (torch 2.13's default) an agent that stays rank 0 across rounds does not publish the new
round's MASTER_ADDR, and a node joining waits for it until the rendezvous times out (60 s).

Every start (the first, after a rank was added, after one was killed) loads the last checkpoint,
written atomically every ``--checkpoint-every`` steps by rank 0 with the step count, the model, the
optimiser, the data position and the controller, so a restart loses at most one checkpoint
interval of progress. The global batch is the same at every world size (the controller splits it
over the ranks), so the run trains on the same samples whatever happens to its ranks. Rank 0 keeps
``progress.json`` in the checkpoint folder (the step, the world size, every (re)start and where it
resumed) and every rank writes its pid to ``pids/rank<r>.pid`` (tests kill ranks through it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from adapters.examples.common import classification_step, cnn_job, resume, save_checkpoint, shut_down
from adapters.torchrun import DynamixController
from sim.datafiles import atomic_write_text


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--iterations", type=int, default=400, help="training steps in all")
    p.add_argument("--interval", type=int, default=10, help="K: iterations per decision")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-sleep-s", type=float, default=0.0, help="pause per step (tests: a slower job)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's rendezvous (elastic: a new one after every restart)
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(args.checkpoint_dir)
    (root / "pids").mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "pids" / f"rank{rank}.pid", f"{os.getpid()}\n")
    model, optimizer, dataset, evaluate, classes = cnn_job("digits", args.lr)
    base, extra = divmod(args.global_batch, world)
    ctl = DynamixController(  # DYNAMIX
        model,
        optimizer,
        policy="static",
        interval=args.interval,
        base_batch=32,
        min_batch=1,
        max_batch=args.global_batch,
        initial_batch=[base + (1 if r < extra else 0) for r in range(world)],
        evaluate=evaluate,
        num_classes=classes,
        workload="cnn/digits",
    )
    sampler = ctl.batch_sampler(len(dataset), seed=0)
    step = 0
    progress_file = root / "progress.json"
    progress = json.loads(progress_file.read_text()) if progress_file.exists() else {"starts": []}
    if (root / "latest.pt").exists():
        step = resume(root / "latest.pt", model, optimizer, sampler, ctl)  # DYNAMIX: any world size
    if rank == 0:
        last = int(progress.get("step", 0))
        progress["starts"].append(
            {"world": world, "resumed_step": step, "last_step_seen": last, "time": time.time()}
        )
        print(f"start at world {world}: resumed from step {step} (last step seen {last})", flush=True)

    def record() -> None:
        if rank == 0:
            progress.update(step=step, world=world, time=time.time())
            atomic_write_text(progress_file, json.dumps(progress) + "\n")

    record()
    loader = DataLoader(dataset, batch_sampler=sampler)
    for x, y in loader:
        if step >= args.iterations:
            break
        classification_step(ctl, model, optimizer, x, y)  # DYNAMIX: the digits example's loop body
        step += 1
        if step % args.checkpoint_every == 0:
            save_checkpoint(root / "latest.pt", model, optimizer, sampler, ctl, step)
        record()
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
    if rank == 0:
        acc, _ = evaluate()
        progress.update(done=True, final_accuracy=acc)
        record()
        print(f"done: {step} steps at world {world}, val acc {acc:.4f}", flush=True)
    ctl = optimizer = model = None
    shut_down()


if __name__ == "__main__":
    main()
