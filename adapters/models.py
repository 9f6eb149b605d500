"""Models for the real adapter: a small CNN for CPU runs and ResNet-18 for GPU runs.

No model here uses BatchNorm by default: with uneven local batches, per-rank batch statistics make
the averaged gradient differ from the global-batch gradient. The CNN has no normalisation and
ResNet-18 uses GroupNorm (per sample, so the equivalence holds exactly); ``norm="syncbatch"``
(CUDA only) gives torch's SyncBatchNorm instead.
"""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("cnn", "mlp", "resnet18")
NORMS = ("group", "syncbatch", "none")


class SmallCNN(nn.Module):
    """conv3x3(16) - ReLU - conv3x3(32) - ReLU - adaptive avg-pool 4x4 - fc(64) - ReLU - fc(C)."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, padding=1, stride=2),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(inplace=True), nn.Linear(64, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _norm(norm: str, channels: int) -> nn.Module:
    if norm == "group":
        return nn.GroupNorm(min(32, channels // 4) or 1, channels)
    if norm == "syncbatch":
        return nn.BatchNorm2d(channels)  # converted by nn.SyncBatchNorm.convert_sync_batchnorm
    return nn.Identity()


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = _norm(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = _norm(norm, cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.n1(self.conv1(x)))
        out = self.n2(self.conv2(out))
        return torch.relu(out + self.short(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 (3x3 stem, no max-pool; 11.2 M parameters for 10 classes)."""

    def __init__(self, in_channels: int, num_classes: int, norm: str = "group") -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), _norm(norm, 64), nn.ReLU())
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride, norm), BasicBlock(cout, cout, 1, norm)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, *, norm: str = "group"
) -> nn.Module:
    """A fresh model (initialised from torch's current RNG state: seed it first)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {list(MODELS)}")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {list(NORMS)}")
    c = input_shape[0]
    if name == "cnn":
        return SmallCNN(c, num_classes)
    if name == "mlp":
        n_in = 1
        for s in input_shape:
            n_in *= s
        return nn.Sequential(nn.Flatten(), nn.Linear(n_in, 128), nn.ReLU(), nn.Linear(128, num_classes))
    model = ResNet18(c, num_classes, norm=norm)
    if norm == "syncbatch":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model
