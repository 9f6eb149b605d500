"""Uneven local batches that every rank agrees on.

All ranks walk one seeded permutation of the training set. Each step takes the next global batch
of ``B = sum(b_i)`` indices (an epoch's tail continues into the next epoch's permutation) and rank
``r`` takes the slice ``[sum(b_0..b_{r-1}), + b_r)``. Every rank therefore takes the same number of
steps whatever its local batch (a ``DistributedSampler`` with per-rank batch sizes does not), and
the union of the slices is exactly the global batch.

The loss weight that makes DDP's averaged gradient the global-batch mean gradient is
``W / B`` on a *summed* per-sample loss (equivalently ``b_r * W / B`` on the local mean):
DDP averages over W ranks, so ``(1/W) sum_r (W/B) sum_{j in r} grad l_j = (1/B) sum_j grad l_j``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch


class GlobalBatchSchedule:
    """The shared walk through seeded per-epoch permutations of ``n`` training indices."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError(f"the training set must hold at least one sample, got n={n}")
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0
        self.cursor = 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next_global(self, global_batch: int) -> np.ndarray:
        """The next ``global_batch`` indices (wrapping into the next epoch's permutation)."""
        out = np.empty(global_batch, dtype=np.int64)
        filled = 0
        while filled < global_batch:
            take = min(global_batch - filled, self.n - self.cursor)
            out[filled : filled + take] = self._perm[self.cursor : self.cursor + take]
            filled += take
            self.cursor += take
            if self.cursor == self.n:
                self.epoch += 1
                self.cursor = 0
                self._perm = self._permutation(self.epoch)
        return out

    @property
    def epochs_done(self) -> float:
        return self.epoch + self.cursor / self.n

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["n"]) != self.n:
            raise ValueError(f"checkpointed schedule covers n={state['n']} samples, this one n={self.n}")
        self.seed, self.epoch, self.cursor = int(state["seed"]), int(state["epoch"]), int(state["cursor"])
        self._perm = self._permutation(self.epoch)


def rank_slice(local_batches: Sequence[int], rank: int) -> slice:
    """Rank ``rank``'s slice of a global batch laid out rank by rank."""
    start = int(sum(local_batches[:rank]))
    return slice(start, start + int(local_batches[rank]))


def loss_weight(local_batches: Sequence[int]) -> float:
    """W / B: the factor on a summed local loss that makes DDP's average the global mean gradient."""
    total = int(sum(local_batches))
    if total <= 0:
        raise ValueError(f"the global batch must be positive, got local batches {list(local_batches)}")
    return len(local_batches) / total


class DynamicBatchSampler(torch.utils.data.Sampler[list[int]]):
    """A ``batch_sampler`` for ``DataLoader`` whose batch size is read at every step.

    ``DataLoader.batch_size`` cannot change after construction; this sampler asks
    ``batches()`` (every rank's current local batch, e.g. ``DynamixController.local_batches``) each
    time it yields, so a batch change takes effect at the next step without rebuilding the loader.
    Use ``num_workers=0`` (or at most a prefetch of one batch) so that no batch is drawn before
    the change is agreed.
    """

    def __init__(
        self, n: int, rank: int, batches: Callable[[], Sequence[int]], seed: int = 0, steps: int | None = None
    ) -> None:
        self.schedule = GlobalBatchSchedule(n, seed)
        self.rank = rank
        self.batches = batches
        self.steps = steps

    def __iter__(self) -> Iterator[list[int]]:
        step = 0
        while self.steps is None or step < self.steps:
            b = list(self.batches())
            idx = self.schedule.next_global(int(sum(b)))
            yield idx[rank_slice(b, self.rank)].tolist()
            step += 1

    def __len__(self) -> int:
        if self.steps is None:
            raise TypeError("DynamicBatchSampler without `steps` is endless and has no length")
        return self.steps
