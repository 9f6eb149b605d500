"""The observation tables people read (the docs' observation reference, the env's docstring, each
schema module's) are the schemas' own (:meth:`ObservationSchema.as_table`), not hand-kept copies."""

from __future__ import annotations

import inspect

import pytest
from support import ROOT, docs_reference

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.obs import ENCODERS, OBS_SCHEMA, v1, v2, v3, v4

HEADER = "| index | name | unit | raw range | description |"


def _tables(text: str) -> list[str]:
    """Every markdown table of ``text`` that starts with the observation tables' header."""
    lines = inspect.cleandoc(text).splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() == HEADER:
            end = i
            while end < len(lines) and lines[end].strip().startswith("|"):
                end += 1
            out.append("\n".join(row.strip() for row in lines[i:end]))
    return out


def test_the_docs_observation_reference_is_every_registered_schemas_table():
    page = docs_reference().observation_page()
    assert _tables(page) == [cls.schema.as_table() for cls in ENCODERS.values()]


def test_no_page_people_read_keeps_an_observation_table_by_hand():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    pages += sorted((ROOT / "dynamix_gym" / "obs").glob("v*.py"))  # their docstrings: with_table
    assert [p.name for p in pages if _tables(p.read_text())] == []


def test_env_docstring_table_is_the_schema_1_centralised_table():
    assert _tables(HeteroClusterEnv.__doc__) == [OBS_SCHEMA.as_table(centralised=True)]


@pytest.mark.parametrize("module", [v1, v2, v3, v4], ids=lambda m: m.__name__)
def test_each_schema_module_docstring_shows_its_per_worker_table(module):
    (encoder,) = [cls for cls in ENCODERS.values() if cls.__module__ == module.__name__]
    assert _tables(module.__doc__) == [encoder.schema.as_table()]


def test_every_registered_schema_has_a_module_with_its_table():
    assert sorted(cls.__module__ for cls in ENCODERS.values()) == [m.__name__ for m in (v1, v2, v3, v4)]
