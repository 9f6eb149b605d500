"""Models for the real adapter: a small CNN for CPU runs, ResNet-18 for GPU runs, and a small
causal transformer for next-byte prediction (the ``pystdlib`` data set).

No model here uses BatchNorm by default: with uneven local batches, per-rank batch statistics make
the averaged gradient differ from the global-batch gradient. The CNN has no normalisation and
ResNet-18 uses GroupNorm (per sample, so the equivalence holds exactly); ``norm="syncbatch"``
(CUDA only) gives torch's SyncBatchNorm instead.
"""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("cnn", "mlp", "resnet18", "transformer")
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


class ByteTransformer(nn.Module):
    """A causal (decoder-only) transformer over bytes: embedding + learned positions, ``layers``
    pre-norm ``nn.TransformerEncoderLayer`` blocks under a causal mask, a final LayerNorm and a
    linear head to the vocabulary. No dropout (a deterministic step).

    The defaults (d_model 96, 4 heads, 2 layers, feed-forward 384, 64 positions, 256 bytes) give
    279,424 parameters; logits have shape ``(batch, positions, vocab)``.
    """

    def __init__(
        self, vocab: int, context: int, d_model: int = 96, heads: int = 4, layers: int = 2, ff_mult: int = 4
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(context, d_model))
        nn.init.normal_(self.pos, std=0.02)
        block = nn.TransformerEncoderLayer(
            d_model,
            heads,
            ff_mult * d_model,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer(
            "causal", nn.Transformer.generate_square_subsequent_mask(context), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.embed(x) + self.pos[:n]
        h = self.blocks(h, mask=self.causal[:n, :n], is_causal=True)
        return self.head(self.norm(h))


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, *, norm: str = "group"
) -> nn.Module:
    """A fresh model (initialised from torch's current RNG state: seed it first).

    For ``transformer``, ``input_shape`` is ``(context,)`` and ``num_classes`` the vocabulary."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {list(MODELS)}")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {list(NORMS)}")
    if name == "transformer":
        if len(input_shape) != 1:
            raise ValueError(
                f"model 'transformer' reads byte sequences (input shape (context,)), got {input_shape}"
            )
        return ByteTransformer(num_classes, int(input_shape[0]))
    if name in ("cnn", "resnet18") and len(input_shape) != 3:
        raise ValueError(f"model {name!r} reads images (input shape (C, H, W)), got {input_shape}")
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
