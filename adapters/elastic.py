"""Elastic real training: a :class:`~adapters.ddp_backend.DDPBackend` whose world size changes.

``resize(n)`` re-forms the process group at ``n`` ranks from the last checkpoint:

1. checkpoint the running job (model, optimiser, data position, coordinator state; atomic);
2. derive the checkpoint of the new world size in a staging folder (the model and optimiser files
   are world-size free: rank 0 writes them and every rank loads them; the coordinator's per-rank
   batches are re-split so that the global batch stays what it was), rename it into place and only
   then move ``latest.json`` to it, so a failure at any point leaves the last complete checkpoint
   in force and no staging folder behind;
3. stop and reap every rank, start ``n`` new ones and resume them from that checkpoint.

The restart time (the wall time of 1-3) is measured, added to the job's wall clock (the job did
not train meanwhile) and listed in :attr:`restarts` and in the next report's ``events``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from adapters import checkpoint as ckpt
from adapters.config import RealDDPConfig
from adapters.ddp_backend import DDPBackend
from sim.protocol import IntervalReport

log = logging.getLogger(__name__)


def split_global_batch(global_batch: int, ranks: int, min_batch: int, max_batch: int) -> list[int]:
    """``global_batch`` split as evenly as whole samples allow over ``ranks`` ranks.

    Raises:
        ValueError: when the split leaves a rank outside [min_batch, max_batch] (naming both).
    """
    base, extra = divmod(int(global_batch), ranks)
    out = [base + (1 if r < extra else 0) for r in range(ranks)]
    if min(out) < min_batch or max(out) > max_batch:
        raise ValueError(
            f"global batch {global_batch} over {ranks} ranks gives local batches {out}, outside "
            f"[min_batch, max_batch] = [{min_batch}, {max_batch}]"
        )
    return out


class ElasticDDPBackend:
    """Real DDP training whose number of ranks changes between intervals (gloo, CPU ranks here).

    Args:
        config: a :class:`RealDDPConfig` with ``checkpoint_dir`` and scalar ``min_batch``,
            ``max_batch`` (per-rank tuples and ``emulate``/``memory_batch`` describe a fixed world).
        max_workers: the largest world size ``resize`` accepts.
    """

    def __init__(self, config: RealDDPConfig, max_workers: int = 8) -> None:
        if not config.checkpoint_dir:
            raise ValueError("ElasticDDPBackend needs config.checkpoint_dir (restarts resume from it)")
        for name in ("min_batch", "max_batch"):
            if not isinstance(getattr(config, name), int):
                raise ValueError(
                    f"ElasticDDPBackend needs a scalar config.{name}, got {getattr(config, name)!r}"
                )
        for name in ("emulate", "memory_batch"):
            if getattr(config, name) is not None:
                raise ValueError(
                    f"ElasticDDPBackend does not support config.{name} (it fixes the world size)"
                )
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be an integer >= 1, got {max_workers!r}")
        self.max_workers = max_workers
        self.config = config
        self.inner = DDPBackend(config)
        self.restarts: list[dict[str, Any]] = []
        self._pending_events: list[str] = []

    @property
    def spec(self):
        return self.inner.spec

    @property
    def world_size(self) -> int:
        return self.inner.config.workers

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        self.inner.reset(seed, rng=rng)

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        report = self.inner.run_interval(local_batches, iterations)
        if self._pending_events:
            report = replace(report, events=tuple(self._pending_events) + tuple(report.events))
            self._pending_events = []
        return report

    def close(self) -> None:
        self.inner.close()

    def parameters(self) -> list[np.ndarray]:
        return self.inner.parameters()

    # --- elasticity ------------------------------------------------------------------------------------
    def resize(self, world_size: int) -> float:
        """Re-form the group at ``world_size`` ranks from a fresh checkpoint; returns the restart
        time in seconds (0 when the size does not change).

        Raises:
            ValueError: ``world_size`` below one or above ``max_workers`` (nothing is changed).
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int | np.integer):
            raise ValueError(f"world_size must be an integer, got {world_size!r}")
        if not 1 <= world_size <= self.max_workers:
            raise ValueError(
                f"world_size (worker count) must lie in [1, {self.max_workers}] (max_workers), got {world_size}"
            )
        old = self.world_size
        if world_size == old:
            return 0.0
        t0 = time.perf_counter()
        wall_before = self.inner.wall_time_s()
        folder = self.inner.save_checkpoint()
        self._stage(folder, int(world_size))
        self.inner.close()
        cfg = replace(self.inner.config, workers=int(world_size), resume=True, initial_batch=None)
        multiplier = self.inner.lr_multiplier
        self.inner = DDPBackend(cfg)
        self.inner.lr_multiplier = multiplier
        self.inner.reset(seed=0)  # the checkpoint restores the run's seed, clocks and data position
        restart_s = time.perf_counter() - t0
        # The group did not train while it re-formed: the job's clock carries on from before it.
        self.inner._wall_offset_s = wall_before + restart_s
        self.inner._t0 = time.perf_counter()
        record = {
            "interval": int(self.inner.resumed_interval or 0),
            "from_ranks": old,
            "to_ranks": int(world_size),
            "restart_s": restart_s,
        }
        self.restarts.append(record)
        self._pending_events.append(f"elastic restart {old} -> {world_size} ranks in {restart_s:.2f} s")
        log.info("elastic restart %d -> %d ranks in %.2f s", old, world_size, restart_s)
        return restart_s

    def _stage(self, folder: Path, world_size: int) -> Path:
        """The checkpoint of ``folder`` for ``world_size`` ranks, committed atomically."""
        root = Path(self.config.checkpoint_dir)
        meta = ckpt.load(folder / "coordinator.pt")
        cfg = self.config
        batches = np.asarray(meta["batches"], dtype=np.int64)
        new_batches = split_global_batch(int(batches.sum()), world_size, cfg.min_batch, cfg.max_batch)
        meta["batches"] = new_batches
        meta["good"] = [max(int(min(meta["good"])), b) for b in new_batches]
        final = folder.with_name(f"{folder.name}-w{world_size}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            shutil.copy2(folder / "worker.pt", tmp / "worker.pt")
            ckpt.atomic_torch_save(meta, tmp / "coordinator.pt")
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        ckpt._atomic_write_json(root / ckpt.LATEST, {"interval": int(meta["interval"]), "path": final.name})
        return final


def run_elastic(
    config: RealDDPConfig,
    decide: Callable[[IntervalReport | None, int], int],
    intervals: int,
    *,
    global_batch: int,
    iterations: int,
    seed: int = 0,
    max_workers: int = 8,
) -> dict[str, Any]:
    """Train ``intervals`` intervals at a constant ``global_batch``; before each one
    ``decide(last_report, world_size)`` (a policy: ``None`` before the first interval) returns the
    world size to train it at, and the group is re-formed from the checkpoint when that changes.
    Returns the final validation accuracy, the accuracy and world size of every interval and the
    measured restarts. Every rank is reaped before it returns, also when ``decide`` raises."""
    cfg = replace(config, initial_batch=None)
    backend = ElasticDDPBackend(cfg, max_workers=max_workers)
    accuracy: list[float] = []
    sizes: list[int] = []
    report: IntervalReport | None = None
    try:
        backend.reset(seed=seed)
        for _ in range(int(intervals)):
            n = int(decide(report, backend.world_size))
            backend.resize(n)
            split = split_global_batch(global_batch, n, cfg.min_batch, cfg.max_batch)
            report = backend.run_interval(np.array(split, dtype=np.int64), iterations)
            accuracy.append(float(report.val_accuracy))
            sizes.append(n)
        return {
            "final_accuracy": accuracy[-1] if accuracy else float("nan"),
            "accuracy": accuracy,
            "world_sizes": sizes,
            "restarts": list(backend.restarts),
            "wall_time_s": float(backend.inner.wall_time_s()),
        }
    finally:
        backend.close()


def run_schedule(
    config: RealDDPConfig,
    world_sizes: list[int],
    *,
    global_batch: int,
    iterations: int,
    seed: int = 0,
    max_workers: int = 8,
) -> dict[str, Any]:
    """:func:`run_elastic` with the world size of every interval given in advance."""
    sizes = [int(n) for n in world_sizes]
    first = replace(config, workers=sizes[0])
    step = iter(sizes)
    return run_elastic(
        first,
        lambda _report, _world: next(step),
        len(sizes),
        global_batch=global_batch,
        iterations=iterations,
        seed=seed,
        max_workers=max_workers,
    )
