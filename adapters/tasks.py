"""What a real training task defines: its loss, its per-interval quality count, its validation, its
validation metric and the config field that sets its target.

The worker ranks (:mod:`adapters.worker`) and the coordinator (:mod:`adapters.ddp_backend`) ask the
task of the configured data set instead of assuming classification:

| task | data sets | models | loss per sample | count (``correct``) | validation metric | target field |
|---|---|---|---|---|---|---|
| classification | digits, mnist, synthetic, cifar_synthetic | cnn, mlp, resnet18 | cross-entropy | correct predictions | accuracy (rising) | ``target_accuracy`` |
| next-byte | pystdlib | transformer | mean cross-entropy over the window's 64 bytes | quality of the sample's loss | ``val_loss`` in nats per byte (falling) | ``target_val_loss`` |

Both losses are summed over samples, so :func:`adapters.sampling.loss_weight` (``W / B``) makes DDP's
average the global-batch mean gradient for either.

A falling metric travels as the project's internal quality (:class:`sim.workloads.QualityMetric`):

    quality = 1 - val_loss * LM_LOSS_SCALE          # val_loss in nats per byte, [0, 10] -> [1, 0]

so the env, the reward, the observation and the episode's end need no special case: the report's
``val_accuracy`` carries the quality and its ``val_loss`` the loss itself; a training interval's
``batch_accuracy`` is the quality of its training loss, as the simulator reports a training-set
quality. A loss beyond the metric's range (10 nats per byte, where an untrained model scores
ln 256 = 5.55) is reported as divergence, not clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sim.workloads import ACCURACY, QualityMetric

#: nats per byte -> fraction: the metric's range is [0, 10] nats per byte.
LM_LOSS_SCALE = 0.1
#: The validation loss of the next-byte task: falling, in nats per byte; untrained: uniform over bytes.
LM_METRIC = QualityMetric("val_loss", higher_is_better=False, scale=LM_LOSS_SCALE, untrained=math.log(256))


@dataclass(frozen=True)
class Classification:
    """Labels ``y`` of shape ``(n,)``; logits ``(n, classes)``."""

    name: str = "classification"
    num_classes: int = 10
    models: tuple[str, ...] = ("cnn", "mlp", "resnet18")
    metric: QualityMetric = ACCURACY
    target_field: str = "target_accuracy"
    default_target: float = 0.95

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy summed over the batch's samples."""
        return F.cross_entropy(out, y, reduction="sum")

    def zero_count(self, device: torch.device) -> torch.Tensor:
        return torch.zeros((), dtype=torch.int64, device=device)

    def count(self, out: torch.Tensor, y: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """Correct predictions in the batch (``batch_accuracy = count / samples``)."""
        return (out.argmax(1) == y).sum()

    def validate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) on the held-out split."""
        correct, loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, x.shape[0], chunk):
                out = model(x[i : i + chunk])
                yc = y[i : i + chunk]
                loss += float(F.cross_entropy(out, yc, reduction="sum"))
                correct += int((out.argmax(1) == yc).sum())
        n = x.shape[0]
        return correct / n, loss / n

    def diverged(self, val_loss: float, batch_losses: list[float]) -> str | None:
        """Why the losses are out of the metric's range (None: they are not); accuracy has no such range."""
        return None


@dataclass(frozen=True)
class NextByte:
    """Windows ``x``, ``y`` of shape ``(n, T)`` (``y`` is ``x`` one byte on); logits ``(n, T, vocab)``."""

    name: str = "next_byte"
    num_classes: int = 256
    models: tuple[str, ...] = ("transformer",)
    metric: QualityMetric = LM_METRIC
    target_field: str = "target_val_loss"
    #: Past the first fast drop of the 2-rank curve at local batch 32 (base_lr 0.2): reached after
    #: ~150 steps, where the loss still falls ~0.1 nats per 100 steps (results/lm/profile/curves.csv).
    default_target: float = 2.3

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample mean cross-entropy over its bytes, summed over the batch's samples."""
        return F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="sum") / y.shape[1]

    def zero_count(self, device: torch.device) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64, device=device)

    def count(self, out: torch.Tensor, y: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """The summed quality of the batch's samples, ``b - scale * loss_sum`` (the quality is
        linear in the loss, so ``count / samples`` is the quality of the mean training loss)."""
        return y.shape[0] - self.metric.scale * loss.detach().to(torch.float64)

    def validate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> tuple[float, float]:
        """(quality, mean cross-entropy per byte) on the held-out windows."""
        loss = 0.0
        with torch.no_grad():
            for i in range(0, x.shape[0], chunk):
                out = model(x[i : i + chunk])
                yc = y[i : i + chunk]
                loss += float(F.cross_entropy(out.flatten(0, 1), yc.flatten(), reduction="sum"))
        mean = loss / y.numel()
        return float(self.metric.to_quality(mean)), mean

    def diverged(self, val_loss: float, batch_losses: list[float]) -> str | None:
        hi = self.metric.value_range[1]
        worst = max([val_loss, *batch_losses])
        if worst > hi:
            return (
                f"the {'validation' if val_loss >= max(batch_losses) else 'training'} loss reached {worst:.3g} "
                f"nats per byte, beyond the val_loss metric's range [0, {hi:g}] (untrained: "
                f"{self.metric.untrained:.3f})"
            )
        return None


Task = Classification | NextByte

CLASSIFICATION = Classification()
NEXT_BYTE = NextByte()
#: The task of each data set (adapters.data.DATASETS).
TASKS: dict[str, Task] = {
    "digits": CLASSIFICATION,
    "mnist": CLASSIFICATION,
    "synthetic": CLASSIFICATION,
    "cifar_synthetic": CLASSIFICATION,
    "pystdlib": NEXT_BYTE,
}


def task_of(dataset: str) -> Task:
    if dataset not in TASKS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(TASKS)}")
    return TASKS[dataset]


def unreachable_target(dataset: str) -> dict[str, float]:
    """The config field and value of a target no run reaches (profiling runs that must not stop)."""
    task = task_of(dataset)
    return {task.target_field: 1.0 if task.metric.higher_is_better else 0.0}
