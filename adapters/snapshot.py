"""An in-memory copy of a training state (the guards' last good snapshot, :mod:`sim.guards`).

Taken after every healthy interval, so taking it must cost little: the first :meth:`save` clones
every tensor of the state (model, optimiser, ...) and later ones copy into those same tensors in
place, allocating nothing. Rollbacks are rare: :meth:`load` hands out a deep copy, so the state
restored from it never shares storage with the snapshot (an optimiser's ``load_state_dict`` keeps
the tensors it is given, and a second rollback must find the snapshot unchanged).
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def _copy_into(dst: Any, src: Any) -> Any:
    if isinstance(src, torch.Tensor):
        if (
            isinstance(dst, torch.Tensor)
            and dst.shape == src.shape
            and dst.dtype == src.dtype
            and dst.device == src.device
        ):
            return dst.copy_(src)
        return src.detach().clone()
    if isinstance(src, dict):
        old = dst if isinstance(dst, dict) else {}
        return {k: _copy_into(old.get(k), v) for k, v in src.items()}
    if isinstance(src, list | tuple):
        old = dst if isinstance(dst, type(src)) and len(dst) == len(src) else [None] * len(src)
        return type(src)(_copy_into(d, v) for d, v in zip(old, src, strict=True))
    return copy.deepcopy(src)


class StateSnapshot:
    """The last saved state; ``None`` until the first :meth:`save`."""

    def __init__(self) -> None:
        self._saved: dict[str, Any] | None = None

    @property
    def taken(self) -> bool:
        return self._saved is not None

    def save(self, state: dict[str, Any]) -> None:
        self._saved = _copy_into(self._saved, state)

    def load(self) -> dict[str, Any]:
        if self._saved is None:
            raise RuntimeError("no snapshot has been taken: nothing to roll back to")
        return copy.deepcopy(self._saved)
