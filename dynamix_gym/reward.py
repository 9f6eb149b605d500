"""Rewards, computed from interval reports only (so sim and real training share them).

``dynamix`` (the DYNAMIX paper's reward, per decision interval):

    r = acc + alpha * max(0, acc - acc_prev) - beta * T_iter - delta * reg(B) - eta * (var|g| + std|g|)

    acc     validation quality at the end of the interval (a rising fraction: the accuracy, or the
            workload's metric mapped by sim.workloads.QualityMetric, e.g. 1 - WER)
    T_iter  mean iteration time of the live workers, seconds
    reg(B)  mean over live workers of |log2(B_i) - c| ("abs", default: grows as B leaves 2^c = 32
            in either direction) or log2(B_i) - c ("signed")
    var|g|, std|g|: variance and standard deviation of the local gradient norm, mean over workers

``time`` (aligned with the headline metric, time-to-accuracy):

    r = -interval_time_s / time_scale_s + target_bonus * [target reached]

so an episode's return is minus its wall time (in ``time_scale_s`` units) plus the bonus.
Every term is returned separately for logging.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from sim.protocol import IntervalReport
from sim.validation import check_choice, check_range

REWARD_KINDS = ("dynamix", "time")
REGULARISERS = ("abs", "signed")


@dataclass(frozen=True)
class RewardConfig:
    kind: str = "dynamix"
    alpha: float = 10.0  # accuracy gain
    beta: float = 1.0  # iteration time, per second
    delta: float = 0.01  # batch-size regulariser
    eta: float = 0.1  # optimiser stability
    regulariser: str = "abs"
    regulariser_center_log2: float = 5.0  # 2^5 = 32
    time_scale_s: float = 60.0
    target_bonus: float = 10.0

    def __post_init__(self) -> None:
        check_choice("reward.kind", self.kind, REWARD_KINDS)
        check_choice("reward.regulariser", self.regulariser, REGULARISERS)
        for name in ("alpha", "beta", "delta", "eta", "target_bonus"):
            check_range(f"reward.{name}", getattr(self, name), 0.0, 1e6)
        check_range("reward.time_scale_s", self.time_scale_s, 0.0, 1e9, low_open=True)

    @classmethod
    def from_any(cls, value: str | dict[str, Any] | RewardConfig | None) -> RewardConfig:
        """A config from a kind name, a mapping of fields, or a config (returned unchanged)."""
        return config_from_any(cls, value, "reward")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_from_any(cls: type, value: Any, what: str) -> Any:
    """A reward config of dataclass ``cls`` from ``None`` (the defaults), a kind name, a mapping of
    its fields (an unknown field fails, naming the known ones) or a ``cls`` (returned unchanged)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        return cls(kind=value)
    known = {f.name for f in fields(cls)}
    unknown = set(value) - known
    if unknown:
        raise ValueError(f"unknown {what} fields {sorted(unknown)}; known: {sorted(known)}")
    return cls(**dict(value))


def compute_reward(
    cfg: RewardConfig,
    report: IntervalReport,
    prev_val_accuracy: float | None,
    reached_target: bool,
) -> tuple[float, dict[str, float]]:
    """The reward of one interval and its terms (each already multiplied by its coefficient)."""
    if cfg.kind == "time":
        terms = {
            "time": -report.interval_time_s / cfg.time_scale_s,
            "target_bonus": cfg.target_bonus if reached_target else 0.0,
        }
        return float(sum(terms.values())), terms
    live = report.alive
    live_list = live.tolist()
    if False not in live_list or True not in live_list:
        b, var, it = report.local_batch, report.grad_norm_var, report.iteration_time_s
    else:
        b, var, it = report.local_batch[live], report.grad_norm_var[live], report.iteration_time_s[live]
    n = b.size
    acc = float(report.val_accuracy)
    gain = 0.0 if prev_val_accuracy is None else max(0.0, acc - prev_val_accuracy)
    # Plain Python over the workers' values: on the few workers of a cluster this is cheaper than
    # numpy calls (the env step's cost is benchmarked in experiments.bench_env).
    c = cfg.regulariser_center_log2
    dev = [math.log2(max(x, 1)) - c for x in b.tolist()]
    reg = sum(map(abs, dev) if cfg.regulariser == "abs" else dev) / n
    stability = sum(v + (math.sqrt(v) if v >= 0 else math.nan) for v in var.tolist()) / n
    terms = {
        "accuracy": acc,
        "accuracy_gain": cfg.alpha * gain,
        "iteration_time": -cfg.beta * sum(it.tolist()) / n,
        "batch_regulariser": -cfg.delta * reg,
        "stability": -cfg.eta * stability,
    }
    total = float(sum(terms.values()))
    if not math.isfinite(total):
        raise FloatingPointError(f"non-finite reward from terms {terms}")
    return total, terms
