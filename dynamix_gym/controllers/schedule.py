"""A batch schedule on validation quality: fixed local batches that change when training reaches
given accuracies (e.g. DYNAMIX's large-early / small-late pattern, or Smith et al.'s increase late).

The schedule-fidelity check (``python -m experiments.schedules``) runs the same schedules on the real
backend and in the calibrated simulator; the controller reads only ``info["report"].val_accuracy``,
so both backends see exactly the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dynamix_gym.actions import check_in_range
from dynamix_gym.controllers.base import BaseController


@dataclass(frozen=True)
class Phase:
    """Run ``batches`` (one local batch per worker, or one for all) from ``from_accuracy`` on."""

    from_accuracy: float
    batches: tuple[int, ...]


def parse_phases(phases: Sequence[Mapping[str, Any]], where: str = "schedule") -> tuple[Phase, ...]:
    """Phases from ``[{from_accuracy: 0.0, batches: 128}, {from_accuracy: 0.9, batches: [16, 48]}]``.

    The first phase starts at accuracy 0; thresholds rise strictly; batches are whole numbers >= 1.
    """
    if not phases:
        raise ValueError(f"{where}: phases must list at least one phase")
    out: list[Phase] = []
    for i, p in enumerate(phases):
        unknown = sorted(set(p) - {"from_accuracy", "batches"})
        if unknown:
            raise ValueError(
                f"{where}.phases[{i}]: unknown keys {unknown}; known: ['from_accuracy', 'batches']"
            )
        acc = float(p.get("from_accuracy", 0.0))
        if not 0.0 <= acc < 1.0:
            raise ValueError(f"{where}.phases[{i}].from_accuracy must be in [0, 1), got {acc}")
        if i == 0 and acc != 0.0:
            raise ValueError(f"{where}.phases[0].from_accuracy must be 0 (the start), got {acc}")
        if out and acc <= out[-1].from_accuracy:
            raise ValueError(
                f"{where}.phases[{i}].from_accuracy must exceed phases[{i - 1}]'s {out[-1].from_accuracy}, got {acc}"
            )
        raw = p.get("batches")
        values = [raw] if np.isscalar(raw) else list(raw or [])
        if not values or any(isinstance(b, bool) or int(b) != b or int(b) < 1 for b in values):
            raise ValueError(f"{where}.phases[{i}].batches must be whole numbers >= 1, got {raw!r}")
        out.append(Phase(acc, tuple(int(b) for b in values)))
    return tuple(out)


class AccuracyScheduleController(BaseController):
    """Local batches by phase; a phase starts once validation accuracy has reached its threshold.

    Phases only advance (the highest accuracy seen so far decides), so a noisy validation dip
    does not switch back. Every phase's batches must lie in each worker's [min_batch, max_batch]:
    a schedule that does not fit the cluster is refused at ``reset``, never clipped.

    Args:
        phases: ``[{from_accuracy, batches}, ...]`` (see :func:`parse_phases`); ``batches`` is one
            local batch for every worker or one per worker (an uneven split).
    """

    name: ClassVar[str] = "accuracy_schedule"

    def __init__(self, phases: Sequence[Mapping[str, Any]]) -> None:
        self.phases = parse_phases(phases)
        self.best_accuracy = 0.0

    def _batches(self, phase: Phase) -> np.ndarray:
        n = self.spec.num_workers
        if len(phase.batches) not in (1, n):
            raise ValueError(f"schedule phase {phase} lists {len(phase.batches)} batches for {n} workers")
        return np.broadcast_to(np.asarray(phase.batches, dtype=np.int64), (n,)).copy()

    def reset(self, spec: Any, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.best_accuracy = 0.0
        for i, phase in enumerate(self.phases):
            check_in_range(self._batches(phase), spec, f"schedule phases[{i}].batches")

    def initial_batches(self, spec: Any) -> np.ndarray:
        """The first phase's batches run the warm-up interval too (a schedule starts as it means to go on)."""
        n = len(spec.gpu_types)
        return np.broadcast_to(np.asarray(self.phases[0].batches, dtype=np.int64), (n,)).copy()

    def phase_at(self, accuracy: float) -> int:
        """Index of the phase in force once ``accuracy`` has been reached."""
        return max(i for i, p in enumerate(self.phases) if p.from_accuracy <= accuracy)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        self.best_accuracy = max(self.best_accuracy, float(info["report"].val_accuracy))
        return self._batches(self.phases[self.phase_at(self.best_accuracy)]).astype(np.float32), None
