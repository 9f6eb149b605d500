"""Observation schema 4: schema 3 plus how each worker's step cost grows with its batch.

At the first decision schemas 2 and 3 have seen one interval at one batch: whether a larger batch
costs in proportion (a CPU rank, a GPU past its knee: more samples per step buy no throughput) or
rides a launch or host floor (a GPU at small batches: they come almost free) is not in the
observation, while an oracle reads the compute curve. A policy cloned from that oracle then raises
where the oracle usually raises, which on the real CPU tasks costs 1.7x the best static batch
(``results/deploy/README.md``). The curve is a fact about the cluster that can be measured before the
run: the real backends' quick calibration times each rank at a ladder of batches right before it
(``calibrate.quick=true``), and the simulator knows its fault-free compute model. The backend's spec
carries it (:attr:`sim.protocol.BackendSpec.compute_curve_s`), and schema 4 reads, for each worker, its
elasticity at the current batch (:func:`sim.protocol.compute_elasticity`: d ln t / d ln b over the
octave above), a scale-free number (1: proportional, 0: free), as ``self.compute_elasticity`` after
schema 2's worker features. A spec without a curve cannot be encoded in schema 4 (a clear error).

Per-worker observation: ``self.*`` then ``global.*`` (:data:`OBS_SCHEMA_V4`; schema 3's worker
features, then ``compute_elasticity``, then schema 3's global features).
Its table, generated from the features at import (the docs' observation reference shows it too):
"""

from __future__ import annotations

import numpy as np

from dynamix_gym.obs.base import Feature, ObservationSchema, with_table
from dynamix_gym.obs.v2 import GLOBAL_FEATURES_V2, WORKER_FEATURES_V2
from dynamix_gym.obs.v3 import REGIME_FEATURES, RegimeAwareEncoder
from sim.protocol import BackendSpec, loglog_elasticity

SCHEMA_VERSION_V4 = "4"

COST_FEATURES: tuple[Feature, ...] = (
    Feature(
        "compute_elasticity",
        "d ln t / d ln b",
        0.0,
        2.0,
        "compute time's growth with the local batch over the octave above it, from the compute curve "
        "measured before the run (1: in proportion, 0: free)",
    ),
)

OBS_SCHEMA_V4 = ObservationSchema(
    SCHEMA_VERSION_V4, WORKER_FEATURES_V2 + COST_FEATURES, GLOBAL_FEATURES_V2 + REGIME_FEATURES
)
__doc__ = with_table(__doc__, OBS_SCHEMA_V4)


class CostAwareEncoder(RegimeAwareEncoder):
    """Observation schema 4 (:data:`OBS_SCHEMA_V4`): schema 3's encoder plus each worker's compute
    elasticity from ``spec.compute_curve_s``.

    Args: as :class:`~dynamix_gym.obs.v2.ScaleFreeEncoder`; ``spec.compute_curve_s`` must be given.
    """

    schema = OBS_SCHEMA_V4

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        self._curve_lo = np.log(spec.min_batch.astype(np.float64))
        self._curve_hi = np.log(spec.max_batch.astype(np.float64))
        self._curve_log_t = None if spec.compute_curve_s is None else np.log(spec.compute_curve_s)
        super().__init__(spec, window, noise_smoothing)

    def _extra_workers(self, local_batch: np.ndarray) -> np.ndarray:
        if self._curve_log_t is None:  # an env may be built before its calibration: refused at the first use
            raise ValueError(MISSING_CURVE)
        e = loglog_elasticity(self._curve_lo, self._curve_hi, self._curve_log_t, local_batch)
        return e[:, None]


#: Why a spec without a compute curve cannot be encoded in schema 4, and what to do.
MISSING_CURVE = (
    "observation schema 4 reads BackendSpec.compute_curve_s, and this backend's spec has none: on real "
    "ranks measure it right before the run (experiments.deploy calibrate.quick=true, or backend "
    "compute_profile=<calibrated profile>), or deploy a bundle of schema 1-3"
)


def require_compute_curve(schema_version: str, spec: BackendSpec) -> None:
    """ValueError (:data:`MISSING_CURVE`) when a bundle of ``schema_version`` needs a curve ``spec`` lacks."""
    if str(schema_version) == SCHEMA_VERSION_V4 and spec.compute_curve_s is None:
        raise ValueError(MISSING_CURVE)
