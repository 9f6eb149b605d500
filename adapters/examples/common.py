"""What the drop-in examples (and the tests' drop-in jobs) share besides the lines marked ``# DYNAMIX``:
the digits / MNIST job and one iteration of it, the controller's command-line settings, checkpoints
of the whole loop and a clean exit."""

from __future__ import annotations

import argparse
import gc
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

from adapters.checkpoint import atomic_torch_save, load
from adapters.data import load_dataset
from adapters.models import build_model


def cnn_job(dataset: str, lr: float) -> tuple[DDP, torch.optim.Optimizer, TensorDataset, Callable, int]:
    """A small CNN on ``dataset`` (``digits`` or ``mnist``, offline) in DDP, SGD with momentum at
    ``lr``, its training set, ``evaluate()`` ((validation accuracy, validation loss)) and its number
    of classes."""
    data = load_dataset(dataset)
    torch.manual_seed(0)
    model = DDP(build_model("cnn", data.input_shape, data.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            out = model.module(data.x_val)
            return float((out.argmax(1) == data.y_val).float().mean()), float(
                F.cross_entropy(out, data.y_val)
            )

    return model, optimizer, TensorDataset(data.x_train, data.y_train), evaluate, data.num_classes


def classification_step(ctl: Any, model: DDP, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> bool:
    """One iteration of a classification loop under the drop-in (the ``# DYNAMIX`` lines of
    ``torchrun_digits.py``); True when a new decision took effect."""
    ctl.begin()
    out = model(x)
    loss = F.cross_entropy(out, y, reduction="sum")
    (loss * ctl.loss_scale).backward()  # W / B gives the global-batch mean gradient
    optimizer.step()
    optimizer.zero_grad()
    return ctl.end(loss.detach(), (out.argmax(1) == y).sum())


def add_controller_args(p: argparse.ArgumentParser, iterations: int, interval: int, lr: float) -> None:
    """The controller's settings on the command line (defaults: ``iterations``, ``interval``, ``lr``)."""
    p.add_argument("--policy", default="static", help="baseline name or PPO bundle path")
    p.add_argument(
        "--policy-kwargs",
        default="{}",
        help="JSON arguments of the baseline, e.g. '{\"global_batch\": null}'",
    )
    p.add_argument("--iterations", type=int, default=iterations, help="training steps at most")
    p.add_argument("--interval", type=int, default=interval, help="K: iterations per decision")
    p.add_argument("--base-batch", type=int, default=32)
    p.add_argument("--initial-batch", type=int, default=None, help="local batch at the start (default: base)")
    p.add_argument("--lr", type=float, default=lr, help="SGD learning rate at the base batch")
    p.add_argument("--lr-rule", default="adascale", choices=["adascale", "linear", "sqrt", "none"])
    p.add_argument(
        "--guards",
        default="act",
        help="off | watch | act, or JSON of sim.guards.GuardConfig fields, e.g. '{\"max_lr_gain\": 4}'",
    )
    p.add_argument("--slowdown", default="", help="per-rank compute multipliers, e.g. 1,3")


def controller_kwargs(args: argparse.Namespace, rank: int, world: int) -> dict[str, Any]:
    """:class:`adapters.torchrun.DynamixController` arguments from :func:`add_controller_args`'s."""
    slow = [float(s) for s in args.slowdown.split(",")] if args.slowdown else [1.0] * world
    return {
        "policy": args.policy,
        "policy_kwargs": json.loads(args.policy_kwargs),
        "interval": args.interval,
        "base_batch": args.base_batch,
        "initial_batch": args.initial_batch,
        "lr_rule": args.lr_rule,
        "guards": json.loads(args.guards) if args.guards.startswith("{") else args.guards,
        "slowdown": slow[rank],
    }


def save_checkpoint(path: Path, model: DDP, optimizer: Any, sampler: Any, ctl: Any, step: int) -> None:
    """Rank 0 writes the loop's state atomically (model, optimiser, data position, controller, step);
    every rank waits for it."""
    if dist.get_rank() == 0:
        state = {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "sampler": sampler.schedule.state_dict(),
            "controller": ctl.state_dict(),
            "step": step,
        }
        atomic_torch_save(state, path)
    dist.barrier()


def resume(path: Path, model: DDP, optimizer: Any, sampler: Any, ctl: Any) -> int:
    """The loop's state from :func:`save_checkpoint`'s file; the step it was written at."""
    state = load(path)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.schedule.load_state_dict(state["sampler"])
    ctl.load_state_dict(state["controller"])  # DYNAMIX (another world size is fine)
    return int(state["step"])


def controller_line(ctl: Any, elapsed_s: float) -> str:
    """Rank 0's closing words on the controller: batches, overhead, policy, guards, and the policy's
    inputs out of its training range (when there were any)."""
    line = (
        f"{elapsed_s:.1f} s, local batches {ctl.batches.tolist()}, controller overhead "
        f"{100 * ctl.overhead_s / max(elapsed_s, 1e-9):.2f}% (policy {ctl.policy.name}, "
        f"{ctl.decisions_without_policy} decisions made without it); guards {ctl.guard.summary()}"
    )
    out = ctl.inputs_out_of_range
    return f"{line}; inputs out of the policy's training range: {out}" if out else line


def shut_down() -> NoReturn:
    """Destroy the process group and leave (the caller dropped its model, optimiser and controller)."""
    gc.collect()
    dist.destroy_process_group()
    os._exit(0)
