"""A drop-in rank for the guards' real-rank tests (a module of its own so that spawned ranks can
import it: tests/ is on the path)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from dynamix_gym.controllers.reckless import RecklessController


def _drive(rank: int, world: int, port: int, steps: int, record, **controller: Any):
    """Train one rank of a drop-in job (digits CNN, SGD at lr 0.1, base batch 32) under
    ``DynamixController(**controller)`` for ``steps`` steps or until done; ``record(ctl)`` after each
    decision. Returns the controller (the process group is destroyed)."""
    from adapters.examples.common import classification_step, cnn_job
    from adapters.torchrun import DynamixController

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    model, opt, dataset, evaluate, _ = cnn_job("digits", lr=0.1)
    ctl = DynamixController(
        model, opt, base_batch=32, min_batch=8, max_batch=256, evaluate=evaluate, **controller
    )
    for step, (x, y) in enumerate(DataLoader(dataset, batch_sampler=ctl.batch_sampler(len(dataset)))):
        if step >= steps or ctl.done:
            break
        decided = ctl.decisions
        classification_step(ctl, model, opt, x, y)
        if ctl.decisions > decided:
            record(ctl)
    dist.destroy_process_group()
    return ctl


def dropin_rank(rank: int, world: int, port: int, guards: Any, steps: int, out: Any) -> None:
    """One rank of a drop-in job (linear rule) driven by the reckless controller."""
    accs = []
    ctl = _drive(
        rank, world, port, steps, lambda c: accs.append(c.last_report.val_accuracy) if rank == 0 else None,
        policy=RecklessController(), interval=10, initial_batch=16, lr_rule="linear", target_accuracy=0.95,
        guards=guards,
    )  # fmt: skip
    if rank == 0:
        out.put({"done": ctl.done, "accs": accs, "guard": ctl.guard.summary(),
                 "events": [e.describe() for e in ctl.guard.events]})  # fmt: skip


def dropin_lr_rank(rank: int, world: int, port: int, guards: Any, steps: int, out: Any) -> None:
    """One rank of a drop-in job at the job's batch held (32 per rank, twice the base) under AdaScale:
    rank 0 reports the rate the rule asked for after each decision."""
    from dynamix_gym.controllers.static import StaticController

    rates = []
    _drive(
        rank, world, port, steps, lambda c: rates.append(c.lr), policy=StaticController(32), interval=5,
        initial_batch=32, lr_rule="adascale", target_accuracy=0.99, guards=guards,
    )  # fmt: skip
    if rank == 0:
        out.put({"rates": rates})
