"""Plain dicts (YAML / Hydra configs) to and from the simulator's specs.

``Scenario``, ``ClusterSpec`` and ``Workload`` are frozen dataclasses; a config file holds their
fields as a nested mapping (pairs and tuples as lists, ``math.inf`` as ``.inf``). Conversion is
strict: an unknown key fails with a message naming it, where it was found and the keys allowed
there, so a typo in a config never silently falls back to a default. Values are then checked by the
dataclasses' own validators.

    scenario_from_dict(scenario_to_dict(s)) == s      # likewise for clusters and workloads

A cluster is written in one of two forms:

* ``{name, nodes: [{gpu, gpus, cpu_cores, host_mem_gib}, ...]}``: exactly these nodes;
* ``{workers, t4_fraction}`` (``name`` optional): the default T4 / V100 mix of
  :func:`sim.cluster.default_cluster`.

A calibrated profile (:mod:`sim.profile`) stores its cluster in the exact-nodes form too, read with
its ``gpu_memory_gib`` (new worker types become :class:`sim.cluster.ProfiledNodeSpec` nodes).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from sim.cluster import ClusterSpec, NodeSpec, ProfiledNodeSpec, default_cluster
from sim.faults import Scenario
from sim.hardware import GPU_MEMORY_GIB
from sim.workloads import Workload

__all__ = [
    "cluster_from_dict",
    "cluster_to_dict",
    "scenario_from_dict",
    "scenario_to_dict",
    "spec_from_dict",
    "spec_to_dict",
    "workload_from_dict",
    "workload_to_dict",
]

T = TypeVar("T")

#: Keys of the default-mix cluster form.
DEFAULT_MIX_KEYS = ("name", "workers", "t4_fraction")
#: Keys of a node in the exact-nodes cluster form.
NODE_KEYS = ("gpu", "gpus", "cpu_cores", "host_mem_gib")


def spec_from_dict(cls: type[T], data: Any, where: str | None = None) -> T:
    """Builds the frozen dataclass ``cls`` from a mapping of its fields, recursing into nested
    specs and tuples of specs; lists become tuples and integers in float fields become floats.

    Raises:
        ValueError: ``data`` is not a mapping, has a key that is not a field of ``cls``, or lacks a
            field without a default. The message names ``where`` (e.g. ``scenario.throttle``).
    """
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of {cls.__name__} fields, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ValueError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(fields)}"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{where}: missing required key{'s' if len(missing) > 1 else ''} {missing}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def spec_to_dict(spec: Any) -> dict[str, Any]:
    """Every field of a spec dataclass as plain Python: nested specs as dicts, tuples as lists."""
    return _plain(dataclasses.asdict(spec))


def scenario_from_dict(data: Mapping[str, Any]) -> Scenario:
    return spec_from_dict(Scenario, data, "scenario")


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    return spec_to_dict(scenario)


def workload_from_dict(data: Mapping[str, Any]) -> Workload:
    return spec_from_dict(Workload, data, "workload")


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    return spec_to_dict(workload)


def cluster_from_dict(
    data: Mapping[str, Any], memory_gib: Mapping[str, float] | None = None, where: str = "cluster"
) -> ClusterSpec:
    """A cluster from its ``nodes`` (exact) or from ``workers`` (the default T4 / V100 mix).

    With ``memory_gib`` (a profile's device memory of its new worker types; see :mod:`sim.profile`)
    only the exact-nodes form is read, and a node of a type listed there, or not in
    ``GPU_MEMORY_GIB``, becomes a :class:`sim.cluster.ProfiledNodeSpec`. ``where`` names the
    source in a profile's error messages."""
    if memory_gib is not None:
        return _profiled_cluster(data, memory_gib, where)
    if not isinstance(data, Mapping):
        raise ValueError(f"cluster must be a mapping, got {type(data).__name__}")
    if "nodes" in data and "workers" in data:
        raise ValueError(
            "cluster: give either `nodes` (the exact nodes) or `workers` (the default T4/V100 mix), not both"
        )
    if "workers" in data:
        unknown = [k for k in data if k not in DEFAULT_MIX_KEYS]
        if unknown:
            raise ValueError(
                f"cluster (default-mix form): unknown key{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}; known keys: {', '.join(DEFAULT_MIX_KEYS)}"
            )
        spec = default_cluster(data["workers"], float(data.get("t4_fraction", 0.5)))
        name = data.get("name")
        return dataclasses.replace(spec, name=str(name)) if name is not None else spec
    if "nodes" not in data:
        raise ValueError(
            "cluster needs `nodes` (a list of {gpu, gpus, cpu_cores, host_mem_gib}) or `workers` "
            f"(the default T4/V100 mix); got keys {list(data)}"
        )
    return spec_from_dict(ClusterSpec, data, "cluster")


def cluster_to_dict(cluster: ClusterSpec) -> dict[str, Any]:
    """The exact-nodes form (every cluster has one); a profiled node's device memory is not part of
    it (a profile keeps it in its ``gpu_memory_gib``)."""
    return {"name": cluster.name, "nodes": [{k: getattr(n, k) for k in NODE_KEYS} for n in cluster.nodes]}


# --- helpers ---------------------------------------------------------------------------------------
def _profiled_cluster(data: Mapping[str, Any], memory_gib: Mapping[str, float], where: str) -> ClusterSpec:
    """:func:`cluster_from_dict`'s profile form: exactly ``{name, nodes: [{gpu, gpus, ...}]}``."""
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise ValueError(
            f"{where}: cluster must be {{name, nodes: [{{gpu, gpus, ...}}, ...]}} with at least one node"
        )
    allowed = set(NODE_KEYS)
    nodes = []
    for i, n in enumerate(data["nodes"]):
        unknown = [k for k in n if k not in allowed]
        if unknown:
            raise ValueError(
                f"{where}: cluster.nodes[{i}]: unknown key(s) {unknown}; known keys: {sorted(allowed)}"
            )
        gpu = str(n.get("gpu", ""))
        kwargs = {k: n[k] for k in NODE_KEYS[1:] if k in n}
        if gpu in memory_gib or gpu not in GPU_MEMORY_GIB:
            if gpu not in memory_gib:
                raise ValueError(
                    f"{where}: worker type {gpu!r} of cluster.nodes[{i}] is not a known GPU "
                    f"({sorted(GPU_MEMORY_GIB)}); give its memory in gpu_memory_gib"
                )
            nodes.append(ProfiledNodeSpec(gpu=gpu, mem_gib=float(memory_gib[gpu]), **kwargs))
        else:
            nodes.append(NodeSpec(gpu=gpu, **kwargs))
    return ClusterSpec(name=str(data.get("name", "profiled")), nodes=tuple(nodes))


def _convert(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return spec_from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is tuple:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ValueError(f"{where} must be a list, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{where} must be a list of {len(args)} values, got {list(value)!r}")
        return tuple(
            _convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if origin in (typing.Union, types.UnionType):
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (float, int) and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"{where} must be a number, got {value!r}")
    if hint is str and not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
