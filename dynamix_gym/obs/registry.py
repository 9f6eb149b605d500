"""The observation schemas this version encodes, by version: one table, looked up by
:func:`get_schema` and :func:`make_encoder` (the env's ``obs_schema``, a bundle's
``schema_version``, the arbitrator's registration)."""

from __future__ import annotations

from types import MappingProxyType

from dynamix_gym.obs.base import EncoderBase, ObservationSchema
from dynamix_gym.obs.v1 import ObservationEncoder
from dynamix_gym.obs.v2 import ScaleFreeEncoder
from dynamix_gym.obs.v3 import RegimeAwareEncoder
from dynamix_gym.obs.v4 import CostAwareEncoder
from sim.protocol import BackendSpec

#: Each version's encoder class (its ``schema`` attribute is the version's
#: :class:`~dynamix_gym.obs.base.ObservationSchema`). Add a schema here and nowhere else.
ENCODERS: MappingProxyType[str, type[EncoderBase]] = MappingProxyType(
    {
        cls.schema.version: cls
        for cls in (ObservationEncoder, ScaleFreeEncoder, RegimeAwareEncoder, CostAwareEncoder)
    }
)
#: Every observation schema this version can encode (and load bundles for), by version.
SCHEMA_VERSIONS: tuple[str, ...] = tuple(ENCODERS)
#: The env's default schema, and the one a bundle that records no version was trained on.
DEFAULT_SCHEMA_VERSION = "1"


def check_schema_version(field: str, version: int | str) -> str:
    """The canonical version string of ``version`` (``1``, ``"2"`` ...), or a ValueError naming ``field``."""
    text = str(version) if isinstance(version, int | str) and not isinstance(version, bool) else None
    if text not in ENCODERS:
        raise ValueError(
            f"{field} must be one of {list(SCHEMA_VERSIONS)} (observation schema), got {version!r}"
        )
    return text


def get_schema(version: int | str) -> ObservationSchema:
    """The observation schema of ``version`` (1: absolute, DYNAMIX's; 2: scale-free; 3: scale-free
    with the learning-rate regime; 4: 3 with each worker's compute elasticity)."""
    return ENCODERS[check_schema_version("obs_schema", version)].schema


def make_encoder(version: int | str, spec: BackendSpec, window: int = 4) -> EncoderBase:
    """A fresh encoder of schema ``version`` for ``spec`` (every encoder has ``schema``, ``reset``
    and ``encode``)."""
    return ENCODERS[check_schema_version("obs_schema", version)](spec, window=window)


def split_centralised(obs, num_workers: int, schema: ObservationSchema | None = None):
    """(N, Fw + Fg) per-worker rows from a centralised observation of ``num_workers`` workers
    (``schema``: the default schema's when omitted)."""
    return (schema or get_schema(DEFAULT_SCHEMA_VERSION)).split_centralised(obs, num_workers)
