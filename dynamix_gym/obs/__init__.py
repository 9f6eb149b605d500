"""Observation schemas: named features computed from an interval report, by version.

* :mod:`~dynamix_gym.obs.base`: :class:`Feature`, :class:`ObservationSchema` (order, names,
  tables) and :class:`EncoderBase` (what every encoder holds);
* :mod:`~dynamix_gym.obs.v1`: schema 1, absolute quantities (DYNAMIX's state; the default);
* :mod:`~dynamix_gym.obs.v2`: schema 2, scale-free;
* :mod:`~dynamix_gym.obs.v3`: schema 3, schema 2 plus the job's learning-rate regime;
* :mod:`~dynamix_gym.obs.v4`: schema 4, schema 3 plus each worker's compute elasticity (its cost curve,
  measured before the run);
* :mod:`~dynamix_gym.obs.registry`: the versions, :func:`get_schema` and :func:`make_encoder`.
"""

from dynamix_gym.obs.base import EncoderBase, Feature, ObservationSchema, per_worker_rows
from dynamix_gym.obs.registry import (
    DEFAULT_SCHEMA_VERSION,
    ENCODERS,
    SCHEMA_VERSIONS,
    check_schema_version,
    get_schema,
    make_encoder,
    split_centralised,
)
from dynamix_gym.obs.v1 import OBS_SCHEMA_V1, ObservationEncoder
from dynamix_gym.obs.v2 import OBS_SCHEMA_V2, ScaleFreeEncoder
from dynamix_gym.obs.v3 import OBS_SCHEMA_V3, RegimeAwareEncoder
from dynamix_gym.obs.v4 import OBS_SCHEMA_V4, CostAwareEncoder

#: The default observation schema (schema 1), exported as ``dynamix_gym.OBS_SCHEMA``.
OBS_SCHEMA = get_schema(DEFAULT_SCHEMA_VERSION)

__all__ = [
    "DEFAULT_SCHEMA_VERSION",
    "ENCODERS",
    "OBS_SCHEMA",
    "OBS_SCHEMA_V1",
    "OBS_SCHEMA_V2",
    "OBS_SCHEMA_V3",
    "OBS_SCHEMA_V4",
    "SCHEMA_VERSIONS",
    "CostAwareEncoder",
    "EncoderBase",
    "Feature",
    "ObservationEncoder",
    "ObservationSchema",
    "RegimeAwareEncoder",
    "ScaleFreeEncoder",
    "check_schema_version",
    "get_schema",
    "make_encoder",
    "per_worker_rows",
    "split_centralised",
]
