"""A small byte-level language model trained with DDP, with DYNAMIX's drop-in batch-size controller.

    torchrun --standalone --nproc-per-node 2 adapters/examples/torchrun_lm.py
    torchrun --standalone --nproc-per-node 2 adapters/examples/torchrun_lm.py \
        --policy dlb --policy-kwargs '{"global_batch": null}' --slowdown 1,3 --target-val-loss 2.5

A causal transformer (279k parameters, :class:`adapters.models.ByteTransformer`) learns to predict
the next byte of the Python standard library's own source (``pystdlib``, :mod:`adapters.corpus`:
every machine has it, offline) on gloo ranks. The quality is the held-out loss in nats per byte,
a *falling* metric: the controller is told so by ``metric`` (:data:`adapters.tasks.LM_METRIC`), and
the validation result, the per-step ``correct`` count and the target are the metric's rising
quality (``1 - loss / 10``), so the env's observation, reward and stop rule need no special case.
The lines marked ``# DYNAMIX`` are all that the controller adds to the loop.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from adapters.data import load_dataset
from adapters.examples.common import add_controller_args, controller_kwargs, controller_line, shut_down
from adapters.models import build_model
from adapters.tasks import LM_METRIC
from adapters.torchrun import DynamixController


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_controller_args(p, iterations=1000, interval=20, lr=0.2)
    p.add_argument("--val-fraction", type=float, default=0.05, help="held-out share of the corpus's windows")
    p.add_argument(
        "--target-val-loss",
        type=float,
        default=2.3,
        help="held-out loss (nats per byte) that ends the run; an untrained model scores ln 256 = 5.55",
    )
    args = p.parse_args()
    if not 0.0 <= args.target_val_loss < LM_METRIC.untrained:
        p.error(
            f"--target-val-loss must be in [0, {LM_METRIC.untrained:.4f}) nats per byte, got {args.target_val_loss}"
        )
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_dataset("pystdlib", val_fraction=args.val_fraction)
    torch.manual_seed(0)
    model = DDP(build_model("transformer", data.input_shape, data.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataset = TensorDataset(data.x_train, data.y_train)

    def byte_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each window's mean cross-entropy per byte, summed over the windows."""
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / y.shape[1]

    def evaluate() -> tuple[float, float]:
        """(quality, loss): the held-out loss in nats per byte and its rising quality."""
        model.module.eval()
        with torch.no_grad():
            loss = float(byte_loss(model.module(data.x_val), data.y_val)) / data.y_val.shape[0]
        model.module.train()
        return float(LM_METRIC.to_quality(loss)), loss

    ctl = DynamixController(  # DYNAMIX
        model,
        optimizer,
        **controller_kwargs(args, rank, world),
        evaluate=evaluate,
        metric=LM_METRIC,  # a falling validation loss, seen as its rising quality
        target_accuracy=float(LM_METRIC.to_quality(args.target_val_loss)),
        num_classes=data.num_classes,
        workload="transformer/pystdlib",
    )
    loader = DataLoader(dataset, batch_sampler=ctl.batch_sampler(len(dataset), seed=0))  # DYNAMIX
    step = 0
    t0 = time.perf_counter()
    for x, y in loader:
        if step >= args.iterations:
            break
        ctl.begin()  # DYNAMIX
        loss = byte_loss(model(x), y)
        (loss * ctl.loss_scale).backward()  # DYNAMIX: W / B gives the global-batch mean gradient
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        quality = y.shape[0] - LM_METRIC.scale * loss.detach()  # DYNAMIX: the samples' summed quality
        if ctl.end(loss.detach(), quality) and rank == 0:  # DYNAMIX
            r = ctl.last_report
            print(
                f"step {step}: val loss {r.val_loss:.3f}; local batches now {ctl.batches.tolist()}",
                flush=True,
            )
        if ctl.done:  # DYNAMIX: every rank stops at the same step
            break
    if rank == 0:
        _, val_loss = evaluate()
        print(
            f"done: {step} steps, {ctl.decisions} decisions, val loss {val_loss:.4f} (target "
            f"{args.target_val_loss:g}, reached {val_loss <= args.target_val_loss}), "
            f"{controller_line(ctl, time.perf_counter() - t0)}",
            flush=True,
        )
    ctl = optimizer = model = None  # free them before destroying the group
    shut_down()


if __name__ == "__main__":
    main()
