"""The simulator's model of the real stage ranks: the digits model's blocks, their measured times
and the measured links (the calibration :mod:`experiments.pipeline_fidelity` fits and writes to
``sim/data/pipeline_cpu_gloo.json``).

The twin is a :class:`~sim.pipeline.simulator.PipelineSimulator` of two CPU workers (one per stage
rank, a :class:`~sim.cluster.ProfiledNodeSpec` of type ``cpu_gloo``) whose block times are the
fitted per-block table, whose links are the fitted ``(bandwidth, latency)`` and whose re-partition
pause is the measured one. The planners read it as the quiet cluster's profile; the fidelity app
compares its times with the ranks'.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from sim.cluster import ClusterSpec, ProfiledNodeSpec
from sim.datafiles import data_path
from sim.faults import FaultWindow, Scenario
from sim.pipeline.model import Block, BlockTable, PipelineModel
from sim.pipeline.simulator import PipelineSimulator
from sim.validation import check_int, check_range

#: The calibration of the twin (``python -m experiments.pipeline_fidelity``).
CALIBRATION_FILE = "pipeline_cpu_gloo.json"
#: The worker type of a CPU gloo stage rank.
CPU_GLOO = "cpu_gloo"


@dataclass(frozen=True)
class RealJob:
    """The real job's shape: the digits model (``num_blocks`` blocks, ``hidden`` wide), ``micro_batch``
    samples per micro-batch (a step of M micro-batches trains on M x micro_batch, as in the
    simulator), SGD at ``lr``, and each rank's memory cap (the whole model must not fit one
    rank, as for a model that needs a pipeline)."""

    num_blocks: int = 8
    hidden: int = 1024
    micro_batch: int = 4
    lr: float = 0.01
    memory_mib: float = 46.0
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        check_int("job.num_blocks", self.num_blocks, 3, 64)
        check_int("job.hidden", self.hidden, 8, 16384)
        check_int("job.micro_batch", self.micro_batch, 1)
        check_range("job.lr", self.lr, 0.0, 10.0, low_open=True)
        check_range("job.memory_mib", self.memory_mib, 0.0, low_open=True)

    def block_dims(self) -> list[tuple[int, int]]:
        dims = [64] + [self.hidden] * (self.num_blocks - 1) + [10]
        return list(itertools.pairwise(dims))


def digits_blocks(job: RealJob) -> list[Block]:
    """The blocks' FLOPs and bytes (fp32; SGD momentum is one buffer per parameter; a block stashes
    its input and output for the backward pass and sends its output on)."""
    out = []
    for i, (a, b) in enumerate(job.block_dims()):
        params = a * b + b
        out.append(Block(f"b{i}", 2e-9 * a * b, 4.0 * params, 4.0 * params, 4.0 * (a + b), 4.0 * b))
    return out


def load_calibration(path: str | Path | None = None) -> dict:
    path = Path(path) if path is not None else data_path(CALIBRATION_FILE)
    if not path.is_file():
        raise FileNotFoundError(
            f"no calibration of the real pipeline at {path}; fit one with python -m experiments.pipeline_fidelity"
        )
    return json.loads(path.read_text())


def twin_model(job: RealJob, calibration: dict) -> PipelineModel:
    """The digits model with the calibration's per-block table (at its micro-batch; the simulator
    scales it in proportion to the samples of a micro-batch)."""
    t = calibration["block_table"]
    if len(t["forward_s"]) != job.num_blocks:
        raise ValueError(
            f"the calibration has {len(t['forward_s'])} blocks, the job {job.num_blocks}: recalibrate"
        )
    table = BlockTable(CPU_GLOO, int(t["micro_batch"]), tuple(t["forward_s"]), tuple(t["backward_s"]))
    return PipelineModel(
        f"digits{job.num_blocks}x{job.hidden}", digits_blocks(job), "cifar10", job.micro_batch,
        tables={CPU_GLOO: table},
    )  # fmt: skip


def cpu_cluster(ranks: int = 2) -> ClusterSpec:
    return ClusterSpec(f"cpu_gloo_{ranks}", (ProfiledNodeSpec(gpu=CPU_GLOO, gpus=ranks, mem_gib=1.0),))


def burst_scenario(
    start_s: float = 5.0, duration_s: float = 3600.0, factor: float = 4.0, stage: int = 0
) -> Scenario:
    """An emulated interference burst: stage rank ``stage`` computes ``factor`` times longer from
    ``start_s`` for ``duration_s`` (no measurement noise beyond what the ranks measure)."""
    return Scenario(
        name="burst",
        description=f"Interference burst x{factor:g} on stage rank {stage} from {start_s:g} s",
        windows=(FaultWindow("interference", start_s, duration_s, stage, factor),),
        compute_noise_cv=0.0,
        measurement_noise_cv=0.0,
    )


def twin_kwargs(job: RealJob, calibration: dict, ranks: int = 2) -> dict:
    """The simulator's keywords of the calibrated twin: the measured pause and links, the job's caps."""
    link = calibration["link"]
    return dict(
        repartition_pause_s=float(calibration["repartition_pause_s"]),
        memory_gib=[job.memory_mib / 1024.0] * ranks,
        link=(float(link["bandwidth_bytes_per_s"]), float(link["latency_s"])),
    )


def twin_simulator(
    job: RealJob,
    scenario: str | Scenario,
    *,
    calibration: dict | None = None,
    ranks: int = 2,
    stages: int | None = None,
) -> PipelineSimulator:
    """The calibrated simulator of the real job (see the module docstring)."""
    cal = calibration if calibration is not None else load_calibration()
    return PipelineSimulator(
        cpu_cluster(ranks), twin_model(job, cal), scenario, stages=stages, schedule=job.schedule,
        **twin_kwargs(job, cal, ranks),
    )  # fmt: skip


def twin_env(job: RealJob, calibration: dict, scenario: str | Scenario, ranks: int = 2, **env_kwargs):
    """``dynamix/PipelineCluster-v1`` on the twin: the simulated env of the real job (``env_kwargs``:
    the env's own, e.g. ``interval_s``, ``target_quality``)."""
    from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv

    return PipelineClusterEnv(
        cpu_cluster(ranks), twin_model(job, calibration), scenario, stages=ranks, schedule=job.schedule,
        simulator_kwargs=twin_kwargs(job, calibration, ranks), **env_kwargs,
    )  # fmt: skip
