"""The DDP backend's training state: checkpoints on disk and the guards' snapshots in memory.

A checkpoint (``checkpoint_dir``, ``checkpoint_every``) survives a crash: ``resume=true`` continues
from it. A snapshot (:mod:`sim.guards`) is the last state the divergence watchdog saw healthy: every
rank keeps its own copy of its model, optimiser, data position and learning-rate ramp (replicas
agree, so nothing moves between ranks), and the coordinator keeps its batches, known-good batches,
noise-scale estimate and last all-reduce time. A rollback restores both and leaves the clocks, the
fault schedule and the sample count running: time lost is time lost.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from adapters import checkpoint as ckpt
from sim.guards import TrainingDiverged
from sim.protocol import IntervalReport

log = logging.getLogger(__name__)


class BackendState:
    """Mixed into :class:`adapters.ddp_backend.DDPBackend` (which provides ``_command``,
    ``_interval``, ``guard`` and the coordinator's fields)."""

    # --- the coordinator's own state -----------------------------------------------------------------
    def _coordinator_state(self) -> dict[str, Any]:
        return {
            "batches": (
                self._last_batches if self._last_batches is not None else self.spec.initial_batch
            ).tolist(),
            "good": self._good.tolist(),
            "last_comm_s": self._last_comm_s,
            "noise": (self.noise.grad_sqr, self.noise.trace_sigma),
        }

    def _load_coordinator_state(self, state: dict[str, Any]) -> None:
        self._last_batches = np.asarray(state["batches"], dtype=np.int64)
        self._good = np.asarray(state["good"], dtype=np.int64)
        self._last_comm_s = float(state["last_comm_s"])
        self.noise.grad_sqr, self.noise.trace_sigma = state["noise"]

    # --- the guards ----------------------------------------------------------------------------------
    def guarded_interval(self, b: np.ndarray, k_iters: int) -> IntervalReport:
        """One interval under the guards: the fallback's batches while it holds control, the
        watchdog's verdict after it, a snapshot after a good interval and, when it fires, a rollback
        and the interval run again at the snapshot's batches (its report covers the whole time)."""
        guard = self.guard
        notes: list[str] = []
        if guard.config.fallback == "hold" and guard.fallback_decides():
            held = np.asarray(guard.held_batches, dtype=np.int64)
            if np.any(held != b):
                notes.append(f"guard: the fallback holds the batches {held.tolist()} (asked {b.tolist()})")
            b = held
        t_start = time.perf_counter()
        seen = len(guard.events)
        try:
            report, diverged = self._interval(b, k_iters), None
        except TrainingDiverged as e:
            if not guard.config.watches:
                raise
            self._intervals += 1  # the interval ran; its time is spent
            report, diverged = None, str(e)
        quality = report.val_accuracy if report is not None else float("nan")
        loss = report.val_loss if report is not None else float("nan")
        verdict = guard.observe(self._intervals - 1, self.wall_time_s(), quality, loss, b.tolist(), diverged)
        if verdict == "snapshot":
            self._take_snapshot()
        elif verdict == "rollback":
            report = self._roll_back(k_iters, t_start)
        for event in guard.events[seen:]:
            notes.append(event.describe())
            log.warning("%s", notes[-1])
        if report is None:  # diverged, and nothing to roll back to (or only watching)
            raise TrainingDiverged(f"{diverged} ({notes[-1] if notes else 'guards off'})")
        if notes:
            report = replace(report, events=(*report.events, *notes))
        return report

    def _take_snapshot(self) -> None:
        self._command("snapshot", {}, deadline_s=10 * self.config.timeout_s)
        self._held_state = self._coordinator_state()

    def _roll_back(self, k_iters: int, t_start: float) -> IntervalReport:
        """Restore the last snapshot on every rank and here, then run the interval again at its
        batches (the fallback's first interval)."""
        self._command("restore", {}, deadline_s=10 * self.config.timeout_s)
        self._load_coordinator_state(self._held_state)
        self.guard.rolled_back(self.wall_time_s())
        self.guard.fallback_intervals += 1
        held = np.asarray(self.guard.held_batches, dtype=np.int64)
        report = self._interval(held, k_iters)  # a second divergence from a good state is raised
        quality, loss = report.val_accuracy, report.val_loss
        if (
            self.guard.observe(self._intervals - 1, self.wall_time_s(), quality, loss, held.tolist())
            == "snapshot"
        ):
            self._take_snapshot()
        return replace(report, interval_time_s=time.perf_counter() - t_start)

    # --- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Model, optimiser, data position (rank 0) and coordinator state, committed atomically."""
        cfg = self.config
        if not cfg.checkpoint_dir:
            raise ValueError("save_checkpoint() needs checkpoint_dir in the config")
        folder = ckpt.checkpoint_path(cfg.checkpoint_dir, self._intervals)
        self._command("checkpoint", {"path": str(folder / "worker.pt")}, deadline_s=10 * cfg.timeout_s)
        meta = {
            "interval": self._intervals,
            "wall_time_s": self.wall_time_s(),
            "samples": self._samples,
            **self._coordinator_state(),
            "run_seed": self.run_seed,
            "fault_rng": self.faults.rng.bit_generator.state,
            "guard": self.guard.state_dict(),
            "extra": {k: fn() for k, fn in self.extra_state.items()},
        }
        ckpt.atomic_torch_save(meta, folder / "coordinator.pt")
        ckpt.commit(cfg.checkpoint_dir, self._intervals)
        return folder

    def _restore(self, folder: Path) -> None:
        self._command("load", {"path": str(folder / "worker.pt")}, deadline_s=10 * self.config.timeout_s)
        meta = ckpt.load(folder / "coordinator.pt")
        self._intervals = int(meta["interval"])
        self._wall_offset_s = float(meta["wall_time_s"])
        self._samples = int(meta["samples"])
        self._load_coordinator_state(meta)
        self.run_seed = int(meta["run_seed"])
        self.faults.reset(self.run_seed, start_s=self._wall_offset_s)
        self.faults.rng.bit_generator.state = meta["fault_rng"]
        if "guard" in meta:  # checkpoints written before the guards hold none
            self.guard.load_state_dict(meta["guard"])
        self.restored_extra = dict(meta["extra"])
        self.resumed_interval = self._intervals
        log.info("resumed from %s (interval %d, t=%.1f s)", folder, self._intervals, self._wall_offset_s)
