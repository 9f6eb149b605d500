"""Cluster specs: nodes of homogeneous GPUs (or of a profile's measured worker type,
:class:`ProfiledNodeSpec`), workers numbered node by node."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.hardware import GPU_MEMORY_GIB
from sim.validation import check_choice, check_int, check_positive

#: GPUs per node of each measured cloud instance (see sim/data/reference/README.md).
GPUS_PER_NODE: dict[str, int] = {"T4": 4, "V100": 8, "RTX2080Ti": 8, "QuadroRTX6000": 4, "A100": 8}


@dataclass(frozen=True)
class NodeSpec:
    gpu: str
    gpus: int
    cpu_cores: int = 16
    host_mem_gib: float = 128.0

    def __post_init__(self) -> None:
        check_choice("node gpu type", self.gpu, GPU_MEMORY_GIB)
        check_int(f"gpus on a {self.gpu} node", self.gpus, 1, 64)
        check_int("cpu_cores", self.cpu_cores, 1)
        check_positive("host_mem_gib", self.host_mem_gib)


@dataclass(frozen=True)
class ProfiledNodeSpec(NodeSpec):
    """A node of a worker type measured by a profile (not one of ``GPU_MEMORY_GIB``'s GPUs).

    ``mem_gib`` is the device memory of one worker (for the memory-utilisation signal only).
    """

    mem_gib: float = 16.0

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, str) or not self.gpu.strip():
            raise ValueError(f"node gpu type must be a non-empty name, got {self.gpu!r}")
        check_int(f"gpus on a {self.gpu} node", self.gpus, 1, 4096)
        check_int("cpu_cores", self.cpu_cores, 1)
        check_positive("host_mem_gib", self.host_mem_gib)
        check_positive(f"mem_gib of worker type {self.gpu}", self.mem_gib)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError(f"cluster {self.name!r} needs at least one node")

    @property
    def num_workers(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU type of each worker, node by node."""
        return tuple(n.gpu for n in self.nodes for _ in range(n.gpus))

    @property
    def node_of_worker(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.nodes)), [n.gpus for n in self.nodes])

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


def homogeneous_cluster(gpu: str, workers: int) -> ClusterSpec:
    return mixed_cluster({gpu: workers}, name=f"{gpu.lower()}x{workers}")


def mixed_cluster(counts: dict[str, int], name: str | None = None) -> ClusterSpec:
    """Packs ``counts[gpu]`` GPUs of each type onto full nodes of that type's instance size."""
    nodes = []
    for gpu, count in counts.items():
        check_choice("gpu type", gpu, GPUS_PER_NODE)
        check_int(f"number of {gpu} workers", count, 0)
        per_node = GPUS_PER_NODE[gpu]
        while count > 0:
            nodes.append(NodeSpec(gpu=gpu, gpus=min(per_node, count)))
            count -= per_node
    label = name or "+".join(f"{c}x{g}" for g, c in counts.items() if c)
    return ClusterSpec(name=label, nodes=tuple(nodes))


def default_cluster(workers: int = 8, t4_fraction: float = 0.5) -> ClusterSpec:
    """The default heterogeneous mix: ``round(workers * t4_fraction)`` T4s beside V100s."""
    check_int("workers", workers, 1, 4096)
    n_t4 = round(workers * t4_fraction)
    return mixed_cluster({"T4": n_t4, "V100": workers - n_t4}, name=f"t4v100x{workers}")


CLUSTERS = {
    "t4v100": lambda: default_cluster(8),
    "t4v100_4": lambda: default_cluster(4),
    "t4v100_16": lambda: default_cluster(16),
    "t4v100_32": lambda: default_cluster(32),
    "t4x8": lambda: homogeneous_cluster("T4", 8),
    "v100x8": lambda: homogeneous_cluster("V100", 8),
    "t4_v100_2080ti": lambda: mixed_cluster({"T4": 4, "V100": 2, "RTX2080Ti": 2}),
    "t4v100_64": lambda: default_cluster(64),
    "a100_t4": lambda: ClusterSpec(
        name="4xA100+4xT4",
        nodes=(NodeSpec(gpu="A100", gpus=4, cpu_cores=64, host_mem_gib=512.0), NodeSpec(gpu="T4", gpus=4)),
    ),
    "a100_t4_16": lambda: ClusterSpec(
        name="8xA100+8xT4",
        nodes=(
            NodeSpec(gpu="A100", gpus=8, cpu_cores=128, host_mem_gib=1024.0),
            *(NodeSpec(gpu="T4", gpus=4),) * 2,
        ),
    ),
    "t4_v100_a100_32": lambda: ClusterSpec(
        name="16xT4+8xV100+8xA100",
        nodes=(
            *(NodeSpec(gpu="T4", gpus=4),) * 4,
            NodeSpec(gpu="V100", gpus=8, cpu_cores=32, host_mem_gib=512.0),
            NodeSpec(gpu="A100", gpus=8, cpu_cores=128, host_mem_gib=1024.0),
        ),
    ),
}


def get_cluster(name: str | ClusterSpec) -> ClusterSpec:
    if isinstance(name, ClusterSpec):
        return name
    check_choice("cluster", name, CLUSTERS)
    return CLUSTERS[name]()
