"""DynPipe's interference predictor for pipeline stages: a random forest from a stage's counters
to its slowdown ratio.

Features of stage s (from a :class:`~sim.pipeline.report.PipelineReport` and the quiet profile,
:class:`~dynamix_gym.pipeline.planner.StageProfile`, so the same code runs on any backend):

    | index | name | meaning |
    |---|---|---|
    | 0 | fwd_vs_profile | log2(measured forward / the profile's for the stage's blocks) |
    | 1 | bwd_vs_profile | log2(measured backward / the profile's) |
    | 2 | fwd_vs_profile_ema | moving average of feature 0 |
    | 3 | gpu_util | device busy counter |
    | 4 | bubble | share of the iterations the stage waits |
    | 5 | idle | share of the interval's wall time it does not compute |
    | 6 | send_vs_profile | log2(measured send / the profile's send at full bandwidth) |
    | 7 | link_mbps | log10(1 + MB/s over the boundary after the stage) |
    | 8 | mem_util | stage memory over its worker's |
    | 9 | work_vs_median | log2(stage fwd + bwd / the stages' median) |

Target (simulator only): ``truth["stage_slowdown"]``, the largest GPU slow-down among the stage's
live workers. Fitted by ``python -m experiments.pipeline_forest`` on the ``pipeline`` split's
train worlds (seeds >= 100), never on its test split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynamix_gym.controllers.interference import ForestPredictor
from dynamix_gym.pipeline.planner import StageProfile
from sim.pipeline.partition import bounds
from sim.pipeline.report import PipelineReport

FEATURES = (
    "fwd_vs_profile",
    "bwd_vs_profile",
    "fwd_vs_profile_ema",
    "gpu_util",
    "bubble",
    "idle",
    "send_vs_profile",
    "link_mbps",
    "mem_util",
    "work_vs_median",
)
FORMAT = 1
DEFAULT_FOREST = Path(__file__).resolve().parents[2] / "results" / "pipeline" / "forest"


class StageFeatures:
    """The per-stage feature rows of each report (keeps the moving average it needs)."""

    def __init__(self, prof: StageProfile, smoothing: float = 0.3) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must lie in (0, 1], got {smoothing}")
        self.prof = prof
        self.smoothing = smoothing
        self._ema = np.full(prof.num_stages, np.nan)

    def update(self, r: PipelineReport) -> np.ndarray:
        p, b, S = self.prof, bounds(r.sizes), r.num_stages
        s = np.arange(S)
        f0 = np.maximum(p.fwd_cum[s, b[1:]] - p.fwd_cum[s, b[:-1]], 1e-12)
        b0 = np.maximum(p.bwd_cum[s, b[1:]] - p.bwd_cum[s, b[:-1]], 1e-12)
        n = p.num_blocks
        x0 = np.where(b[1:] < n, p.send_next[s, np.minimum(b[1:], n)], 0.0) + p.send_prev[s, b[:-1]]
        fv = np.log2(np.maximum(r.fwd_time_s, 1e-12) / f0)
        ema = np.where(np.isnan(self._ema), fv, self.smoothing * fv + (1 - self.smoothing) * self._ema)
        self._ema = ema
        work = r.fwd_time_s + r.bwd_time_s
        link = np.zeros(S)
        link[: S - 1] = r.link_bytes_per_s / 1e6
        return np.column_stack(
            [
                fv,
                np.log2(np.maximum(r.bwd_time_s, 1e-12) / b0),
                ema,
                r.gpu_util,
                r.bubble_fraction,
                r.idle_fraction,
                np.log2(np.maximum(r.send_time_s, 1e-9) / np.maximum(x0, 1e-9)),
                np.log10(1.0 + link),
                r.mem_util,
                np.log2(np.maximum(work, 1e-12) / max(float(np.median(work)), 1e-12)),
            ]
        )


class StagePredictor(ForestPredictor):
    """The pipeline stages' predictor (this module's ``FEATURES``)."""

    FEATURES = FEATURES
    FORMAT = FORMAT
    WHAT = "stage slowdown predictor"
    FITTER = "python -m experiments.pipeline_forest"

    @classmethod
    def load(cls, folder: str | Path = DEFAULT_FOREST) -> StagePredictor:
        return super().load(folder)
