"""The observation and action reference pages, written from the code at every docs build.

Nothing here is a copy: the tables are :meth:`ObservationSchema.as_table` of every registered schema
(:data:`dynamix_gym.obs.ENCODERS`), the constants and their ``#:`` comments are read from
``dynamix_gym/actions.py``, the spaces from envs built with each mode, and the prose from the envs'
own docstrings. ``docs/hooks/mkdocs_hooks.py`` adds the pages to the build; the tests import this
module without MkDocs (``tests/docs/test_reference_pages.py``).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

#: Sphinx roles in the project's docstrings (``:class:`~a.B```) become code spans (`B`).
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|obj|exc):`(~?)([^`]+)`")


def strip_roles(text: str) -> str:
    """``text`` with every Sphinx role written as a code span (the last name alone after ``~``)."""

    def code(match: re.Match) -> str:
        target = match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"

    return _ROLE.sub(code, text)


def docstring_section(doc: str, title: str) -> str:
    """The body of the ``## title`` section of a Gymnasium-style docstring, dedented, roles as code."""
    lines = inspect.cleandoc(doc).splitlines()
    if f"## {title}" not in lines:
        raise ValueError(f"the docstring has no '## {title}' section")
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return strip_roles("\n".join(lines[start:end]).strip())


def _summary(module) -> str:
    """The first paragraph of ``module``'s docstring, on one line."""
    return " ".join(strip_roles(inspect.cleandoc(module.__doc__).split("\n\n")[0]).split())


def observation_page() -> str:
    """Markdown: every registered observation schema's per-worker table, its sizes and a matrix of
    which features each version has."""
    import importlib

    from dynamix_gym.obs import DEFAULT_SCHEMA_VERSION, ENCODERS

    out = [
        "# Observation reference",
        "",
        "Generated from the schema registry (`dynamix_gym/obs/registry.py`) at every docs build: each table is",
        "`ObservationSchema.as_table()` of the version's schema. Choose a version with the env's `obs_schema`",
        f"(default {DEFAULT_SCHEMA_VERSION}); a PPO bundle records the version it was trained on and refuses",
        "another. The narrative of schemas 2, 3 and 4 is in [The env](../env.md).",
        "",
        "## Layout",
        "",
        "Each raw value is clipped to its raw range and mapped affinely onto [-1, 1]. The env's observation",
        "(centralised) for N workers is `Box(-1, 1, (Fw N + Fg,), float32)`: every worker's per-worker",
        "features (worker i's feature k at index `Fw i + k`) followed by the global ones (`Fw N + k`). The",
        "per-worker row of the shared policy (`dynamix/HeteroClusterPerWorker-v0`, `PerWorkerVecEnv`, the",
        "PettingZoo form) is the worker's own features followed by the global ones (`self.*`, then `global.*`).",
        "",
        "| version | module | per-worker features (Fw) | global features (Fg) | centralised size | per-worker row |",
        "|---|---|---|---|---|---|",
    ]
    for version, cls in ENCODERS.items():
        s = cls.schema
        out.append(
            f"| {version} | `{cls.__module__}` (`{cls.__name__}`) | {s.worker_dim} | {s.global_dim} "
            f"| {s.worker_dim} N + {s.global_dim} | {s.per_worker_dim} |"
        )
    for version, cls in ENCODERS.items():
        module = importlib.import_module(cls.__module__)
        out += [
            "",
            f"## Schema {version}",
            "",
            f"`{cls.__module__}`: {_summary(module)}",
            "",
            "Per-worker row of the shared policy:",
            "",
            cls.schema.as_table(),
        ]
    names: dict[str, list[str]] = {}
    for version, cls in ENCODERS.items():
        for name in cls.schema.per_worker_names():
            names.setdefault(name, []).append(version)
    out += [
        "",
        "## Features by version",
        "",
        "| feature | " + " | ".join(f"schema {v}" for v in ENCODERS) + " |",
        "|---|" + "---|" * len(ENCODERS),
    ]
    for name, versions in names.items():
        out.append(f"| {name} | " + " | ".join("yes" if v in versions else "" for v in ENCODERS) + " |")
    return "\n".join(out) + "\n"


def _documented_constants(module) -> list[tuple[str, str, str]]:
    """(name, value source, ``#:`` comment) of every module-level constant of ``module``, in order."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    out = []
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not isinstance(node, ast.Assign | ast.AnnAssign) or not isinstance(target, ast.Name):
            continue
        if not target.id.isupper():
            continue
        comment, i = [], node.lineno - 2
        while i >= 0 and lines[i].lstrip().startswith("#"):
            comment.insert(0, lines[i].lstrip().lstrip("#:").strip())
            i -= 1
        out.append((target.id, ast.get_source_segment(source, node.value), " ".join(comment)))
    return out


def action_page() -> str:
    """Markdown: the action modes (the env docstring's description), the spaces an env of each mode
    has, the split modes and every constant of ``dynamix_gym/actions.py``."""
    import gymnasium as gym

    from dynamix_gym import actions
    from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv

    out = [
        "# Action reference",
        "",
        "Generated at every docs build from `dynamix_gym/actions.py` (the one place an action becomes",
        "local batches: the env, the torchrun drop-in, the arbitrator) and the envs' docstrings.",
        "",
        "## Batch actions (`dynamix/HeteroCluster-v0`)",
        "",
        docstring_section(HeteroClusterEnv.__doc__, "Action Space"),
        "",
        "### The spaces, on a 4-worker cluster",
        "",
        '`gym.make("dynamix/HeteroCluster-v0", workers=4, action_mode=mode).action_space`, and the',
        "steps of the discrete modes (`action_set` sets others):",
        "",
        "| action mode | action space | default steps |",
        "|---|---|---|",
    ]
    for mode in actions.ACTION_MODES:
        env = gym.make("dynamix/HeteroCluster-v0", workers=4, action_mode=mode)
        try:
            steps = env.unwrapped.action_set if mode in actions.DISCRETE_ACTION_MODES else None
            shown = ", ".join(f"{x:g}" for x in steps) if steps is not None else "-"
            out.append(f"| `{mode}` | `{env.action_space}` | {shown} |")
        finally:
            env.close()
    out += [
        "",
        "## Constants of `dynamix_gym.actions`",
        "",
        "| name | value | meaning |",
        "|---|---|---|",
    ]
    for name, value, comment in _documented_constants(actions):
        out.append(f"| `{name}` | `{value}` | {strip_roles(comment) or '-'} |")
    out += [
        "",
        "## Elastic actions (`dynamix/ElasticCluster-v0`)",
        "",
        docstring_section(ElasticClusterEnv.__doc__, "Action Space"),
        "",
        "The functions behind these pages are in the API reference: [`dynamix_gym.actions`]"
        "(../api/dynamix_gym/actions.md).",
    ]
    return "\n".join(out) + "\n"


def write(out_dir: Path) -> list[Path]:
    """Write both pages under ``out_dir`` (for reading them without a docs build)."""
    pages = {"observations.md": observation_page(), "actions.md": action_page()}
    for name, text in pages.items():
        (out_dir / name).write_text(text)
    return [out_dir / name for name in pages]
