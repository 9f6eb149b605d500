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
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from adapters.checkpoint import atomic_torch_save, load
from adapters.data import load_dataset
from adapters.models import build_model
from adapters.torchrun import DynamixController


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="static", help="baseline name or PPO bundle path")
    p.add_argument(
        "--policy-kwargs",
        default="{}",
        help="JSON arguments of the baseline, e.g. '{\"global_batch\": null}'",
    )
    p.add_argument("--iterations", type=int, default=1500, help="training steps at most")
    p.add_argument("--interval", type=int, default=50, help="K: iterations per decision")
    p.add_argument("--base-batch", type=int, default=32)
    p.add_argument("--initial-batch", type=int, default=None, help="local batch at the start (default: base)")
    p.add_argument("--dataset", default="digits", choices=["digits", "mnist"])
    p.add_argument(
        "--guards",
        default="act",
        help="off | watch | act, or JSON of sim.guards.GuardConfig fields, e.g. '{\"max_lr_gain\": 4}'",
    )
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at the base batch")
    p.add_argument("--lr-rule", default="adascale", choices=["adascale", "linear", "sqrt", "none"])
    p.add_argument("--target", type=float, default=0.97, help="validation accuracy that ends the run")
    p.add_argument("--slowdown", default="", help="per-rank compute multipliers, e.g. 1,3")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-every", type=int, default=5, help="decisions between checkpoints")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_dataset(args.dataset)
    torch.manual_seed(0)
    model = DDP(build_model("cnn", data.input_shape, data.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataset = TensorDataset(data.x_train, data.y_train)

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            out = model.module(data.x_val)
            return float((out.argmax(1) == data.y_val).float().mean()), float(
                F.cross_entropy(out, data.y_val)
            )

    slow = [float(s) for s in args.slowdown.split(",")] if args.slowdown else [1.0] * world
    ctl = DynamixController(  # DYNAMIX
        model,
        optimizer,
        policy=args.policy,
        policy_kwargs=json.loads(args.policy_kwargs),
        interval=args.interval,
        base_batch=args.base_batch,
        initial_batch=args.initial_batch,
        lr_rule=args.lr_rule,
        guards=json.loads(args.guards) if args.guards.startswith("{") else args.guards,
        evaluate=evaluate,
        target_accuracy=args.target,
        num_classes=data.num_classes,
        workload=f"cnn/{args.dataset}",
        slowdown=slow[rank],
    )
    sampler = ctl.batch_sampler(len(dataset), seed=0)  # DYNAMIX: reads the batch every step
    step = 0
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if ckpt_dir is not None and (ckpt_dir / "latest.pt").exists():
        state = load(ckpt_dir / "latest.pt")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.schedule.load_state_dict(state["sampler"])
        ctl.load_state_dict(state["controller"])  # DYNAMIX
        step = int(state["step"])
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
            if rank == 0:
                atomic_torch_save(
                    {
                        "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "sampler": sampler.schedule.state_dict(),
                        "controller": ctl.state_dict(),
                        "step": step,
                    },
                    ckpt_dir / "latest.pt",
                )
            dist.barrier()
        if ctl.done:  # DYNAMIX: every rank stops at the same step
            break
    elapsed = time.perf_counter() - t0
    if rank == 0:
        acc, _ = evaluate()
        print(
            f"done: {step} steps, {ctl.decisions} decisions, val acc {acc:.4f}, {elapsed:.1f} s, "
            f"local batches {ctl.batches.tolist()}, controller overhead {100 * ctl.overhead_s / elapsed:.2f}% "
            f"(policy {ctl.policy.name}, {ctl.decisions_without_policy} decisions made without it); "
            f"guards {ctl.guard.summary()}",
            flush=True,
        )
    ctl = optimizer = model = None  # free them before destroying the group
    gc.collect()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
