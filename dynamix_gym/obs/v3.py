"""Observation schema 3: schema 2 plus the job's learning-rate regime.

Schema 2 (:mod:`dynamix_gym.obs.v2`) cannot tell the two regimes of the convergence model
apart until their progress differs: with the learning rate scaled to the batch (AdaScale, linear,
sqrt) a larger batch costs only statistical efficiency, while without scaling (``lr_rule: none``,
ResNet-34 / CIFAR-100 in the benchmark) it lowers the accuracy the run can reach, so that the
same growth that is right for CIFAR-10 misses CIFAR-100's target. Whether a job scales its
learning rate, and the batch its learning rate was tuned for, are facts the job states when it
starts (:attr:`sim.protocol.BackendSpec.lr_rule` and ``base_batch``; the real backend, the
torchrun drop-in and the arbitrator's registration carry both), so schema 3 reads them as two
global features after schema 2's (``global.lr_scaled``, ``global.batch_to_base``). Both are
relative to the job's own scale (the second to its own base batch), so the schema stays scale-free.

Per-worker observation: ``self.*`` then ``global.*`` (:data:`OBS_SCHEMA_V3`; rows 0-28 are schema
2's). Its table, generated from the features at import (the docs' observation reference shows it too):
"""

from __future__ import annotations

import math

from dynamix_gym.obs.base import Feature, ObservationSchema, with_table
from dynamix_gym.obs.v2 import GLOBAL_FEATURES_V2, WORKER_FEATURES_V2, ScaleFreeEncoder
from sim.protocol import BackendSpec

SCHEMA_VERSION_V3 = "3"

REGIME_FEATURES: tuple[Feature, ...] = (
    Feature(
        "lr_scaled",
        "flag",
        0.0,
        1.0,
        "1 if the job scales its learning rate with the batch (adascale, linear, sqrt), 0 if not",
    ),
    Feature(
        "batch_to_base",
        "log2(ratio)",
        -6.0,
        10.0,
        "global batch / the batch the learning rate was tuned for (base_batch)",
    ),
)

OBS_SCHEMA_V3 = ObservationSchema(SCHEMA_VERSION_V3, WORKER_FEATURES_V2, GLOBAL_FEATURES_V2 + REGIME_FEATURES)
__doc__ = with_table(__doc__, OBS_SCHEMA_V3)


class RegimeAwareEncoder(ScaleFreeEncoder):
    """Observation schema 3 (:data:`OBS_SCHEMA_V3`): schema 2's encoder plus the regime features.

    Args: as :class:`~dynamix_gym.obs.v2.ScaleFreeEncoder`.
    """

    schema = OBS_SCHEMA_V3

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        self._lr_scaled = 0.0 if spec.lr_rule == "none" else 1.0
        self._log2_base = math.log2(max(int(spec.base_batch), 1))
        super().__init__(spec, window, noise_smoothing)

    def _extra_globals(self, global_batch: int) -> tuple[float, ...]:
        return (self._lr_scaled, math.log2(max(global_batch, 1)) - self._log2_base)
