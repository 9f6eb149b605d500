"""The observation tables people read (README.md, the env's and schema 2's docstrings) are the
schemas' own (:meth:`ObservationSchema.as_table`), not hand-kept copies."""

from __future__ import annotations

import inspect
from pathlib import Path

import dynamix_gym.schema_v2 as schema_v2
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.schema import OBS_SCHEMA
from dynamix_gym.schema_v2 import OBS_SCHEMA_V2

README = Path(__file__).resolve().parents[3] / "README.md"
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


def test_readme_table_is_the_schema_1_per_worker_table():
    assert _tables(README.read_text()) == [OBS_SCHEMA.as_table()]


def test_env_docstring_table_is_the_schema_1_centralised_table():
    assert _tables(HeteroClusterEnv.__doc__) == [OBS_SCHEMA.as_table(centralised=True)]


def test_schema_2_docstring_table_is_its_per_worker_table():
    assert _tables(schema_v2.__doc__) == [OBS_SCHEMA_V2.as_table()]
