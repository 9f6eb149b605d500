"""One registry of observation schemas: each version's encoder carries its schema, the lookups
answer from it, and an unknown version is refused by name."""

from __future__ import annotations

import pytest

import dynamix_gym
from dynamix_gym import HeteroClusterEnv
from dynamix_gym.obs import (
    DEFAULT_SCHEMA_VERSION,
    ENCODERS,
    SCHEMA_VERSIONS,
    CostAwareEncoder,
    ObservationEncoder,
    RegimeAwareEncoder,
    ScaleFreeEncoder,
    get_schema,
    make_encoder,
)


def test_versions_map_to_their_encoders_and_schemas():
    assert SCHEMA_VERSIONS == ("1", "2", "3", "4")
    assert dict(ENCODERS) == {
        "1": ObservationEncoder,
        "2": ScaleFreeEncoder,
        "3": RegimeAwareEncoder,
        "4": CostAwareEncoder,
    }
    for version, cls in ENCODERS.items():
        assert cls.schema.version == version
        assert get_schema(version) is cls.schema and get_schema(int(version)) is cls.schema
    assert DEFAULT_SCHEMA_VERSION == "1" and dynamix_gym.OBS_SCHEMA is get_schema(DEFAULT_SCHEMA_VERSION)


@pytest.mark.parametrize("version", ["1", 2, "3", 4])
def test_make_encoder_builds_the_versions_encoder(version):
    spec = HeteroClusterEnv(workers=3).backend.spec
    encoder = make_encoder(version, spec, window=2)
    assert type(encoder) is ENCODERS[str(version)] and encoder.window == 2 and encoder.spec is spec


@pytest.mark.parametrize("bad", [0, "5", "v1", True, None, 1.0])
def test_unknown_versions_are_refused_by_name(bad):
    with pytest.raises(
        ValueError, match=r"obs_schema must be one of \['1', '2', '3', '4'\] \(observation schema\)"
    ):
        get_schema(bad)
    with pytest.raises(ValueError, match="obs_schema must be one of"):
        make_encoder(bad, HeteroClusterEnv(workers=2).backend.spec)


def test_registry_is_read_only():
    with pytest.raises(TypeError):
        ENCODERS["5"] = ObservationEncoder  # type: ignore[index]
