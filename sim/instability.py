"""Divergence in the simulator: a rise of the learning rate that collapses training.

Real runs collapse where the convergence model never loses accuracy: a jump of the global batch under
a rule that scales the learning rate (linear, AdaScale at a large noise scale) can drop validation
quality to chance within an interval, and a run left at that rate stays there
(``results/instability/``). Every policy trained in a simulator without this learns that a large
jump is free. :class:`InstabilityModel` adds it, fitted by ``python -m experiments.fit_instability``
to the real jump campaign (``python -m experiments.jump_campaign``):

    event      the global batch rose and, with it, the learning-rate multiplier g (capped and backed
               off by the guards, ``sim.guards``) rose above its value in the last interval
    P(collapse | event) = sigmoid(intercept + slope * log2(g) + ramp_effect * [ramped])
    collapse   progress *= 1 - depth          (depth 1: back to chance)
    stuck      while g stays at or above the rate that collapsed it, progress does not advance
               (the real runs left at the rate stayed at chance); a lower rate releases it

``g`` is the level the rule sets relative to the base learning rate, not the ratio of the jump: a
rate is unstable because of where it is, and two jumps of x2 reach the risk of one of x4. In the
campaign every jump starts at the base rate, so level and ratio coincide there. ``ramped`` is a rise
under the guards' learning-rate ramp (``lr_ramp_iters > 0``).

Off unless a model is given (``Simulator(instability=...)``): the shipped workloads have no fitted
data, so their results stay as they were. Draws come from a stream of their own, spawned after the
engine's others, so a model that never fires leaves every other draw of a run unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim.validation import check_range

INSTABILITY_FILE = "instability.json"


@dataclass(frozen=True)
class InstabilityParams:
    """The fitted chance and depth of a collapse (see the module docstring)."""

    name: str  # what it was fitted to (task, model)
    intercept: float
    slope: float  # per log2 of the learning-rate multiplier; >= 0
    ramp_effect: float  # on the logit, for a ramped rise; <= 0 makes a ramp safer
    depth: float  # fraction of progress a collapse loses, (0, 1]

    def __post_init__(self) -> None:
        for f in ("intercept", "slope", "ramp_effect", "depth"):
            if not math.isfinite(getattr(self, f)):
                raise ValueError(f"instability {self.name}.{f} must be finite, got {getattr(self, f)!r}")
        check_range(f"instability {self.name}.slope", self.slope, 0.0, 100.0)
        check_range(f"instability {self.name}.depth", self.depth, 1e-6, 1.0)

    def chance(self, gain: float, ramped: bool) -> float:
        """P(collapse) of a rise to the learning-rate multiplier ``gain``."""
        z = self.intercept + self.slope * math.log2(max(gain, 1e-12)) + (self.ramp_effect if ramped else 0.0)
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def load_instability(ref: str | Path | InstabilityParams | dict[str, Any] | None) -> InstabilityParams | None:
    """A model from itself, its fields, an ``instability.json`` or the folder holding one; None: off."""
    if ref is None or isinstance(ref, InstabilityParams):
        return ref
    if isinstance(ref, dict):
        return InstabilityParams(**ref)
    path = Path(ref)
    if path.is_dir():
        path = path / INSTABILITY_FILE
    if not path.is_file():
        raise ValueError(
            f"instability model {str(ref)!r} not found (write one: python -m experiments.fit_instability)"
        )
    with open(path) as fh:
        doc = json.load(fh)
    fields = set(InstabilityParams.__dataclass_fields__)
    return InstabilityParams(**{k: v for k, v in doc["model"].items() if k in fields})


class InstabilityModel:
    """The per-run state: the last learning-rate multiplier and the rate a collapse is stuck at."""

    def __init__(self, params: InstabilityParams) -> None:
        self.params = params
        self.reset(None)

    @classmethod
    def of(cls, ref: str | Path | InstabilityParams | dict[str, Any] | None) -> InstabilityModel | None:
        """A model for :func:`load_instability`'s ``ref``; None (off) for None."""
        params = load_instability(ref)
        return cls(params) if params is not None else None

    def reset(self, rng: Any) -> None:
        """A new run; ``rng`` (a numpy Generator of its own) draws one uniform per interval."""
        self.rng = rng
        self.last_gain: float | None = None
        self.last_batch: int | None = None
        self.stuck_gain: float | None = None
        self.collapses = 0

    def interval(self, global_batch: int, convergence: Any, progress: float, ramped: bool) -> float:
        """Start of an interval at ``global_batch`` (``convergence``: the run's
        :class:`sim.convergence.ConvergenceModel`, at ``progress``): the factor on progress
        (``1 - depth`` on a collapse, else 1). One draw per interval, fired or not."""
        gain = convergence.lr_multiplier(global_batch, progress)
        u = float(self.rng.random())
        factor = 1.0
        rose = self.last_batch is not None and global_batch > self.last_batch and gain > self.last_gain
        if self.stuck_gain is not None and gain < self.stuck_gain:
            self.stuck_gain = None  # a lower rate: training can move again
        if rose and u < self.params.chance(gain, ramped):
            factor = 1.0 - self.params.depth
            self.stuck_gain = gain
            self.collapses += 1
        self.last_gain, self.last_batch = gain, global_batch
        return factor

    @property
    def stuck(self) -> bool:
        return self.stuck_gain is not None

    def state_dict(self) -> dict[str, Any]:
        return {"last_gain": self.last_gain, "last_batch": self.last_batch, "stuck_gain": self.stuck_gain}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_gain, self.last_batch, self.stuck_gain = (
            state["last_gain"],
            state["last_batch"],
            state["stuck_gain"],
        )


def instability_doc(params: InstabilityParams, **report: Any) -> dict[str, Any]:
    """The JSON document :func:`load_instability` reads (``report``: the fit's figures, for people)."""
    return {"generated_by": "python -m experiments.fit_instability", "model": asdict(params), **report}
