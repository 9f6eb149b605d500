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
from pathlib import Path
from typing import Any

import numpy as np

from adapters import checkpoint as ckpt
from sim.guards import GuardedBackend

log = logging.getLogger(__name__)


class BackendState(GuardedBackend):
    """Mixed into :class:`adapters.ddp_backend.DDPBackend` (which provides ``_command``,
    ``_interval``, ``guard`` and the coordinator's fields); the guards' interval is
    :class:`sim.guards.GuardedBackend`'s."""

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

    # --- the guards' snapshots (sim.guards.GuardedBackend calls these) -----------------------------------
    def _take_snapshot(self) -> None:
        self._command("snapshot", {}, deadline_s=10 * self.config.timeout_s)
        self._held_state = self._coordinator_state()

    def _restore_snapshot(self) -> None:
        self._command("restore", {}, deadline_s=10 * self.config.timeout_s)
        self._load_coordinator_state(self._held_state)

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
