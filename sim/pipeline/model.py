"""A model for pipeline parallelism: an ordered list of blocks and what each costs.

A block's compute on a GPU type comes from its FLOPs and the fitted compute model of the
measured application whose speed it borrows (``sim/data/compute_models.json``, fitted by
``python -m experiments.fit_hardware``): the fit gives the GPU time of one training step of the
application at local batch ``b``, forward and backward together (3x the forward FLOPs), so

    T_app(g, b)    = alpha_s + beta_s * b ** exponent + knee(b)        # fitted, GPU g, application
    s_per_gflop    = T_app(g, b) / (3 * F_app)                         # F_app: forward GFLOPs / sample
    T_fwd(block)   = fwd_gflops * s_per_gflop                          # one micro-batch of b samples
    T_bwd(block)   = bwd_gflops * s_per_gflop                          # bwd_gflops defaults to 2 fwd

or from a measured per-block table (:func:`load_block_table`, columns ``gpu, block, micro_batch,
forward_s, backward_s``), scaled in proportion to the micro-batch. Memory per block: parameters
and optimiser state (bytes), activations stashed for the backward pass and the output sent to the
next block (bytes per sample).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.hardware import compute_params
from sim.validation import check_choice, check_int, check_positive, check_range
from sim.workloads import Workload, get_workload

#: Forward GFLOPs per sample of the measured applications' models. ResNet-18 on 32x32 inputs and
#: ResNet-50 on 224x224 from their architectures (torchvision's counts: 0.56, 4.09); BERT-base at
#: 384 tokens by the 2 * parameters * tokens rule (Kaplan et al. 2020): 2 * 110e6 * 384.
APP_FORWARD_GFLOPS: dict[str, float] = {"cifar10": 0.56, "imagenet": 4.09, "bert": 84.5}
#: Backward over forward FLOPs of a block when it does not name its own (two matrix products per
#: forward one: the input gradient and the weight gradient).
BACKWARD_FLOPS_RATIO = 2.0


@dataclass(frozen=True)
class Block:
    """One block of a sequential model (per-sample FLOPs and activations; whole-block state)."""

    name: str
    fwd_gflops: float  # forward GFLOPs per sample
    param_bytes: float  # parameters
    optim_bytes: float  # optimiser state (Adam: 2 x the fp32 parameters)
    activation_bytes: float  # stashed for the backward pass, per sample
    output_bytes: float  # sent on to the next block, per sample
    bwd_gflops: float | None = None  # backward GFLOPs per sample (None: BACKWARD_FLOPS_RATIO x forward)

    def __post_init__(self) -> None:
        check_positive(f"block {self.name}.fwd_gflops", self.fwd_gflops)
        for name in ("param_bytes", "optim_bytes", "activation_bytes", "output_bytes"):
            check_range(f"block {self.name}.{name}", getattr(self, name), 0.0)
        if self.bwd_gflops is not None:
            check_positive(f"block {self.name}.bwd_gflops", self.bwd_gflops)

    @property
    def backward_gflops(self) -> float:
        return self.fwd_gflops * BACKWARD_FLOPS_RATIO if self.bwd_gflops is None else self.bwd_gflops


@dataclass(frozen=True)
class BlockTable:
    """Measured forward and backward seconds of every block on one GPU type, at ``micro_batch``."""

    gpu: str
    micro_batch: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]

    def __post_init__(self) -> None:
        check_int(f"block table {self.gpu}.micro_batch", self.micro_batch, 1)
        if len(self.forward_s) != len(self.backward_s) or not self.forward_s:
            raise ValueError(f"block table {self.gpu}: forward_s and backward_s need equal, non-zero lengths")
        for i, (f, b) in enumerate(zip(self.forward_s, self.backward_s, strict=True)):
            check_positive(f"block table {self.gpu}.forward_s[{i}]", f)
            check_positive(f"block table {self.gpu}.backward_s[{i}]", b)


class PipelineModel:
    """A sequential model to be cut into stages, and the workload whose convergence it follows.

    Args:
        name: a label.
        blocks: the blocks in order (at least 2).
        workload: a :class:`~sim.workloads.Workload` or preset name: its convergence model, target
            and learning-rate rule apply; its measured application's compute fits give the speeds.
        micro_batch: samples per micro-batch (>= 1).
        speed_app: the measured application whose fitted compute models give seconds per GFLOP
            (``APP_FORWARD_GFLOPS``' keys; ``None``: the workload's).
        tables: measured per-block times (:class:`BlockTable`) by GPU type; they replace the
            FLOP-based times on that type.
    """

    def __init__(
        self,
        name: str,
        blocks: Sequence[Block],
        workload: str | Workload = "cifar10",
        micro_batch: int = 8,
        *,
        speed_app: str | None = None,
        tables: Mapping[str, BlockTable] | None = None,
    ) -> None:
        self.name = name
        self.blocks = tuple(blocks)
        check_int(f"model {name}: number of blocks", len(self.blocks), 2)
        self.workload = get_workload(workload)
        self.micro_batch = check_int("micro_batch", micro_batch, 1)
        self.speed_app = check_choice("speed_app", speed_app or self.workload.app, APP_FORWARD_GFLOPS)
        self.tables = dict(tables or {})
        for gpu, t in self.tables.items():
            if len(t.forward_s) != len(self.blocks):
                raise ValueError(
                    f"block table {gpu} has {len(t.forward_s)} blocks, the model {name} has {len(self.blocks)}"
                )
        b = self.blocks
        self._cum_fwd = np.concatenate(([0.0], np.cumsum([x.fwd_gflops for x in b])))
        self._cum_bwd = np.concatenate(([0.0], np.cumsum([x.backward_gflops for x in b])))
        self._cum_state = np.concatenate(([0.0], np.cumsum([x.param_bytes + x.optim_bytes for x in b])))
        self._cum_params = np.concatenate(([0.0], np.cumsum([x.param_bytes for x in b])))
        self._cum_act = np.concatenate(([0.0], np.cumsum([x.activation_bytes for x in b])))
        self._out = np.array([x.output_bytes for x in b])
        self._per_gflop: dict[tuple[str, float], float] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def seconds_per_gflop(self, gpu: str, samples: float) -> float:
        """T_app(g, b) / (3 F_app) at b = ``samples``: GPU seconds of a micro-batch of ``samples``
        per GFLOP per sample of its blocks."""
        key = (gpu, samples)
        if key not in self._per_gflop:
            p = compute_params(gpu, self.speed_app)
            t_app = p.alpha_s + p.beta_s * samples**p.exponent + float(p.knee_time_s(samples))
            self._per_gflop[key] = t_app / (3.0 * APP_FORWARD_GFLOPS[self.speed_app])
        return self._per_gflop[key]

    def stage_compute_s(self, gpu: str, lo: int, hi: int, samples: float) -> tuple[float, float]:
        """(forward, backward) seconds of blocks ``[lo, hi)`` on one ``gpu`` for ``samples`` samples."""
        table = self.tables.get(gpu)
        if table is not None:
            scale = samples / table.micro_batch
            return (math.fsum(table.forward_s[lo:hi]) * scale, math.fsum(table.backward_s[lo:hi]) * scale)
        per = self.seconds_per_gflop(gpu, samples)
        return (
            (self._cum_fwd[hi] - self._cum_fwd[lo]) * per,
            (self._cum_bwd[hi] - self._cum_bwd[lo]) * per,
        )

    def state_bytes(self, lo: int, hi: int) -> float:
        """Parameters plus optimiser state of blocks ``[lo, hi)``."""
        return float(self._cum_state[hi] - self._cum_state[lo])

    def param_bytes(self, lo: int, hi: int) -> float:
        return float(self._cum_params[hi] - self._cum_params[lo])

    def activation_bytes(self, lo: int, hi: int) -> float:
        """Activations stashed per sample by blocks ``[lo, hi)``."""
        return float(self._cum_act[hi] - self._cum_act[lo])

    def output_bytes(self, block: int) -> float:
        """Bytes per sample that block ``block`` sends on."""
        return float(self._out[block])

    def __repr__(self) -> str:
        return f"PipelineModel({self.name!r}, {self.num_blocks} blocks, workload={self.workload.name!r})"


def uniform_model(
    num_blocks: int, fwd_gflops: float = 1.0, *, workload: str = "cifar10", micro_batch: int = 8, **kw
) -> PipelineModel:
    """``num_blocks`` identical blocks (tests and hand-computed cases)."""
    block = dict(param_bytes=4e6, optim_bytes=8e6, activation_bytes=2e5, output_bytes=5e4)
    block.update(kw)
    blocks = [Block(f"b{i}", fwd_gflops, **block) for i in range(num_blocks)]
    return PipelineModel(f"uniform{num_blocks}", blocks, workload, micro_batch)


@dataclass(frozen=True)
class ModelShape:
    """The ranges generated models are drawn from (the ``pipeline`` split's train and test shapes
    differ in these)."""

    num_blocks: tuple[int, int] = (8, 64)
    unevenness: tuple[float, float] = (0.2, 0.8)  # s.d. of log block FLOPs
    total_gflops: tuple[float, float] = (2.0, 12.0)  # forward GFLOPs per sample of the whole model
    params_millions: tuple[float, float] = (20.0, 400.0)
    micro_batch: tuple[int, ...] = (4, 8, 16)
    workload: str = "cifar10"

    def __post_init__(self) -> None:
        check_int("shape.num_blocks[0]", self.num_blocks[0], 2)
        check_int("shape.num_blocks[1]", self.num_blocks[1], self.num_blocks[0])
        check_range("shape.unevenness[0]", self.unevenness[0], 0.0, 3.0)
        check_range("shape.unevenness[1]", self.unevenness[1], self.unevenness[0], 3.0)
        check_positive("shape.total_gflops[0]", self.total_gflops[0])
        check_range("shape.total_gflops[1]", self.total_gflops[1], self.total_gflops[0])
        check_positive("shape.params_millions[0]", self.params_millions[0])
        check_range("shape.params_millions[1]", self.params_millions[1], self.params_millions[0])
        for m in self.micro_batch:
            check_int("shape.micro_batch", m, 1)


def generate_model(
    rng: np.random.Generator, shape: ModelShape | None = None, name: str = "gen"
) -> PipelineModel:
    """A model of uneven blocks drawn from ``shape`` (every draw from ``rng``).

    n        ~ U{num_blocks}
    w_i      ~ LogNormal(0, sigma), sigma ~ U(unevenness)          # relative cost of block i
    gflops_i = F * w_i / sum(w),  F ~ LogU(total_gflops)
    params_i = P * v_i / sum(v),  v_i = w_i * LogNormal(0, 0.5)     # heavy blocks hold more
    act_i    = stash bytes ~ 4 bytes x 2e5 x w_i x LogNormal(0, 0.3); output = act_i / 4
    """
    shape = shape or ModelShape()
    n = int(rng.integers(shape.num_blocks[0], shape.num_blocks[1] + 1))
    sigma = float(rng.uniform(*shape.unevenness))
    w = np.exp(sigma * rng.standard_normal(n))
    total = float(np.exp(rng.uniform(*np.log(shape.total_gflops))))
    gflops = total * w / w.sum()
    v = w * np.exp(0.5 * rng.standard_normal(n))
    params = float(np.exp(rng.uniform(*np.log(shape.params_millions)))) * 1e6 * v / v.sum()
    act = 4.0 * 2e5 * w * np.exp(0.3 * rng.standard_normal(n))
    mb = int(rng.choice(shape.micro_batch))
    blocks = [
        Block(f"b{i}", float(gflops[i]), 4.0 * params[i], 8.0 * params[i], float(act[i]), float(act[i] / 4))
        for i in range(n)
    ]
    return PipelineModel(f"{name}{n}", blocks, shape.workload, mb)


BLOCK_TABLE_COLUMNS = ("gpu", "block", "micro_batch", "forward_s", "backward_s")


def load_block_table(path: str | Path) -> dict[str, BlockTable]:
    """Measured per-block times from a CSV (``BLOCK_TABLE_COLUMNS``), one table per GPU type; the
    blocks of each type must be numbered 0..n-1 at one micro-batch."""
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(BLOCK_TABLE_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: block table lacks columns {sorted(missing)}")
        rows: dict[str, list[dict[str, str]]] = {}
        for row in reader:
            rows.setdefault(row["gpu"], []).append(row)
    tables = {}
    for gpu, rs in rows.items():
        rs.sort(key=lambda r: int(r["block"]))
        if [int(r["block"]) for r in rs] != list(range(len(rs))):
            raise ValueError(f"{path}: the blocks of {gpu} must be numbered 0..{len(rs) - 1}")
        mbs = {int(r["micro_batch"]) for r in rs}
        if len(mbs) != 1:
            raise ValueError(f"{path}: {gpu} rows mix micro-batches {sorted(mbs)}")
        tables[gpu] = BlockTable(
            gpu,
            mbs.pop(),
            tuple(float(r["forward_s"]) for r in rs),
            tuple(float(r["backward_s"]) for r in rs),
        )
    return tables
