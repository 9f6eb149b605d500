"""Rewards of the elastic problem, from the interval report and the interval's spend.

``scheduler`` (the RL cloud scheduler's reward, PRIOR_ART.md):

    r = alpha X / X_max - beta C / C_max + gamma dQ / Q_target - smoothing mean((a - a_prev)^2)

    X      samples/s over the interval (wall time, restarts included); X_max: every slot of the
           pool at its memory cap with no barrier (ElasticSimBackend.ideal_throughput)
    C      dollars spent in the interval; C_max: the whole pool's cost rate over the same time
    dQ     validation-quality gain over the interval (a rising fraction), Q_target the target
    a      the normalised decision: worker deltas / 2 per offer and log(lr) / log(1.25)

``cost`` (cost to accuracy):

    r = -(C + time_value_usd_per_hour * T / 3600) / usd_scale + target_bonus [target reached]

an episode's return is minus its dollars (plus the value of its time, 0 unless set) plus the bonus.
Every term is returned separately.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dynamix_gym.reward import config_from_any
from sim.protocol import IntervalReport
from sim.validation import check_choice, check_range

ELASTIC_REWARD_KINDS = ("scheduler", "cost")


@dataclass(frozen=True)
class ElasticRewardConfig:
    kind: str = "cost"
    alpha: float = 1.0  # throughput
    beta: float = 1.0  # cost
    gamma: float = 1.0  # progress
    smoothing: float = 0.1  # the scheduler's action-smoothing coefficient
    usd_scale: float = 0.1  # cost: dollars per unit of reward
    time_value_usd_per_hour: float = 0.0  # cost: what an hour of waiting is worth
    target_bonus: float = 10.0

    def __post_init__(self) -> None:
        check_choice("reward.kind", self.kind, ELASTIC_REWARD_KINDS)
        for name in ("alpha", "beta", "gamma", "smoothing", "time_value_usd_per_hour", "target_bonus"):
            check_range(f"reward.{name}", getattr(self, name), 0.0, 1e6)
        check_range("reward.usd_scale", self.usd_scale, 0.0, 1e9, low_open=True)

    @classmethod
    def from_any(cls, value: str | dict[str, Any] | ElasticRewardConfig | None) -> ElasticRewardConfig:
        return config_from_any(cls, value, "elastic reward")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def elastic_reward(
    cfg: ElasticRewardConfig,
    report: IntervalReport,
    *,
    cost_usd: float,
    max_cost_rate_usd_per_hour: float,
    throughput_max: float,
    quality_gain: float,
    target_quality: float,
    decision: np.ndarray,
    prev_decision: np.ndarray,
    reached_target: bool,
) -> tuple[float, dict[str, float]]:
    """The reward of one interval and its terms (each already multiplied by its coefficient)."""
    t = max(float(report.interval_time_s), 1e-9)
    if cfg.kind == "cost":
        terms = {
            "dollars": -cost_usd / cfg.usd_scale,
            "time_value": -cfg.time_value_usd_per_hour * t / 3600.0 / cfg.usd_scale,
            "target_bonus": cfg.target_bonus if reached_target else 0.0,
        }
    else:
        throughput = report.samples / t
        cost_max = max(max_cost_rate_usd_per_hour * t / 3600.0, 1e-12)
        diff = np.asarray(decision, dtype=np.float64) - np.asarray(prev_decision, dtype=np.float64)
        terms = {
            "throughput": cfg.alpha * throughput / max(throughput_max, 1e-12),
            "cost": -cfg.beta * cost_usd / cost_max,
            "progress": cfg.gamma * quality_gain / max(target_quality, 1e-12),
            "smoothing": -cfg.smoothing * float(np.mean(diff**2)) if diff.size else 0.0,
        }
    return float(sum(terms.values())), terms
