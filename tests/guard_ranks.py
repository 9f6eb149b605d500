"""A drop-in rank for the guards' real-rank tests (a module of its own so that spawned ranks can
import it: tests/ is on the path)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from dynamix_gym.controllers.reckless import RecklessController


def dropin_rank(rank: int, world: int, port: int, guards: Any, steps: int, out: Any) -> None:
    """One rank of a drop-in job (digits CNN, SGD, linear rule) driven by the reckless controller."""
    from adapters.data import load_dataset
    from adapters.models import build_model
    from adapters.torchrun import DynamixController

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = DDP(build_model("cnn", data.input_shape, data.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def evaluate():
        with torch.no_grad():
            o = model.module(data.x_val)
            return float((o.argmax(1) == data.y_val).float().mean()), float(F.cross_entropy(o, data.y_val))

    ctl = DynamixController(
        model, opt, policy=RecklessController(), interval=10, base_batch=32, min_batch=8, max_batch=256,
        initial_batch=16, lr_rule="linear", evaluate=evaluate, target_accuracy=0.95, guards=guards,
    )  # fmt: skip
    dataset = TensorDataset(data.x_train, data.y_train)
    accs = []
    for step, (x, y) in enumerate(DataLoader(dataset, batch_sampler=ctl.batch_sampler(len(dataset)))):
        if step >= steps or ctl.done:
            break
        ctl.begin()
        o = model(x)
        loss = F.cross_entropy(o, y, reduction="sum")
        (loss * ctl.loss_scale).backward()
        opt.step()
        opt.zero_grad()
        decided = ctl.decisions
        ctl.end(loss.detach(), (o.argmax(1) == y).sum())
        if rank == 0 and ctl.decisions > decided:
            accs.append(ctl.last_report.val_accuracy)
    if rank == 0:
        out.put({"done": ctl.done, "accs": accs, "guard": ctl.guard.summary(),
                 "events": [e.describe() for e in ctl.guard.events]})  # fmt: skip
    dist.destroy_process_group()
