"""An ordinary DDP training script with DYNAMIX's drop-in batch-size controller added.

    torchrun --nproc-per-node 2 adapters/examples/torchrun_digits.py
    torchrun --standalone --nproc-per-node 2 adapters/examples/torchrun_digits.py \
        --policy dlb --policy-kwargs '{"global_batch": null}' --slowdown 1,3
    # several nodes: torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
    #     --rdzv-endpoint HOST:29400 adapters/examples/torchrun_digits.py

Trains a small CNN on scikit-learn's digits (offline) with gloo. The lines marked ``# DYNAMIX``
are all that the controller adds to the loop. ``--slowdown`` makes ranks emulate slower devices
(sleeping in proportion to their measured compute), so one CPU host can show a T4 beside a V100.
With ``--checkpoint-dir`` the model, optimiser, data position and controller are saved atomically
every ``--checkpoint-every`` decisions, and a restarted run resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader

from adapters.examples.common import (
    add_controller_args,
    cnn_job,
    controller_kwargs,
    controller_line,
    resume,
    save_checkpoint,
    shut_down,
)
from adapters.torchrun import DynamixController


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_controller_args(p, iterations=1500, interval=50, lr=0.05)
    p.add_argument("--dataset", default="digits", choices=["digits", "mnist"])
    p.add_argument("--target", type=float, default=0.97, help="validation accuracy that ends the run")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-every", type=int, default=5, help="decisions between checkpoints")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, dataset, evaluate, classes = cnn_job(args.dataset, args.lr)
    ctl = DynamixController(  # DYNAMIX
        model,
        optimizer,
        **controller_kwargs(args, rank, world),
        evaluate=evaluate,
        target_accuracy=args.target,
        num_classes=classes,
        workload=f"cnn/{args.dataset}",
    )
    sampler = ctl.batch_sampler(len(dataset), seed=0)  # DYNAMIX: reads the batch every step
    step = 0
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if ckpt_dir is not None and (ckpt_dir / "latest.pt").exists():
        step = resume(ckpt_dir / "latest.pt", model, optimizer, sampler, ctl)
        if rank == 0:
            print(f"resumed from step {step} at local batches {ctl.batches.tolist()}", flush=True)
    loader = DataLoader(dataset, batch_sampler=sampler)
    t0 = time.perf_counter()
    for x, y in loader:
        if step >= args.iterations:
            break
        ctl.begin()  # DYNAMIX
        out = model(x)
        loss = F.cross_entropy(out, y, reduction="sum")
        (loss * ctl.loss_scale).backward()  # DYNAMIX: W / B gives the global-batch mean gradient
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if ctl.end(loss.detach(), (out.argmax(1) == y).sum()) and rank == 0:  # DYNAMIX
            r = ctl.last_report
            print(
                f"step {step}: val acc {r.val_accuracy:.3f}; local batches now {ctl.batches.tolist()}",
                flush=True,
            )
        if ckpt_dir is not None and ctl.decisions and step % (args.interval * args.checkpoint_every) == 0:
            save_checkpoint(ckpt_dir / "latest.pt", model, optimizer, sampler, ctl, step)
        if ctl.done:  # DYNAMIX: every rank stops at the same step
            break
    if rank == 0:
        acc, _ = evaluate()
        line = controller_line(ctl, time.perf_counter() - t0)
        print(f"done: {step} steps, {ctl.decisions} decisions, val acc {acc:.4f}, {line}", flush=True)
    ctl = optimizer = model = None  # free them before destroying the group
    shut_down()


if __name__ == "__main__":
    main()
