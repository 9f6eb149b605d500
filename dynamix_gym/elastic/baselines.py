"""Baselines of ``dynamix/ElasticCluster-v0``: fixed allocations, a goodput-per-dollar rule and a
greedy oracle over the pool. Each emits the env's Dict action; batches stay as they are (the batch
part of the action keeps every local batch), so they differ only in what they rent and when.

``fixed``: hold ``counts`` GPUs of each offer for the whole run, re-requesting preempted spot GPUs
when their capacity returns.

``goodput_per_dollar`` (Pollux-style growing and shrinking, priced): per GPU type an online rate
(samples/s of compute, EMA of the measured ``b / compute_time``), the gradient noise scale from the
two-batch estimates, and

    goodput(c)   = (M / M0) * E(M) / T_iter(c)              # progress per second of holding c
    T_iter(c)    = max over types held of b / rate_type + measured all-reduce time
    E(M)         = (B_noise + M0) / (B_noise + M),  M = b * GPUs held
    price_eff(k) = price_k + [spot] preemptions/h * restart_s / 3600 * cost rate now

At most every ``cooldown`` intervals it plans one change (one restart) of up to ``max_changes``
GPUs, one at a time: release one GPU of the offer whose marginal goodput per dollar falls below
``shrink * threshold``, else request one of the offer whose marginal goodput per dollar beats
``threshold`` ((progress/s) per ($/h)), until neither holds (at most 2 per offer).

``spot_backfill`` (a hand-written heuristic): hold ``gpus`` GPUs of type ``gpu``, ``on_demand`` of
them on demand and the rest on the spot market, replace a preempted (or unavailable) spot GPU by an
on-demand one of the same type, and release every GPU of the other types. Two choices set what a
preemption costs, each change of the held set being one restart:

* ``swap_on_notice``: release a spot GPU as soon as its preemption notice shows and request its
  on-demand replacement in the same change (one restart), instead of waiting for the loss (a forced
  restart) and replacing it afterwards (a second one);
* ``hand_back``: give the on-demand replacements back once spot capacity returns (one more restart
  each time, for the price difference), or keep them to the end.

Defaults (``on_demand=0``, ``swap_on_notice=False``, ``hand_back=True``) are the plain spot-first
backfill.

``oracle_pool``: the greedy oracle extended with the pool. From the simulator's ground truth
(``info["elastic_truth"]``) it scores holding the current set and every single-offer change of
-2..+2 GPUs by the dollars (plus ``time_value_usd_per_hour`` per hour) per unit of progress over the
next interval, a change paying the restart, and takes the best. Simulation only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynamix_gym.stats import NoiseScaleEstimator
from sim.elastic import LR_RANGE
from sim.scaling import adascale_gain
from sim.validation import check_int, check_range

ELASTIC_BASELINES = ("fixed", "goodput_per_dollar", "oracle_pool", "spot_backfill")


@dataclass(frozen=True)
class ElasticSpec:
    """Static facts an elastic controller may know: the offers and their prices and capacity."""

    offers: tuple[str, ...]
    price_usd_per_gpu_hour: np.ndarray
    capacity: np.ndarray
    slot_offer: np.ndarray
    gpu_of_offer: tuple[str, ...]
    spot: np.ndarray
    preemptions_per_hour: float
    restart_s: float
    base_batch: int
    interval: int
    num_slots: int
    batch_mode: str
    batch_action: str

    @classmethod
    def from_env(cls, env: Any) -> ElasticSpec:
        env = env.unwrapped
        job = env.job
        return cls(
            offers=env.offers,
            price_usd_per_gpu_hour=job.offer_price.copy(),
            capacity=job.capacity.copy(),
            slot_offer=job.slot_offer.copy(),
            gpu_of_offer=tuple(o.split("/")[0] for o in env.offers),
            spot=np.array([o.endswith("/spot") for o in env.offers]),
            preemptions_per_hour=env.pool.preemption.rate_per_hour,
            restart_s=env.pool.restart_s,
            base_batch=env.backend.spec.base_batch,
            interval=env.interval,
            num_slots=env.num_workers,
            batch_mode=env.batch_mode,
            batch_action=env.batch_action,
        )


class ElasticController:
    """Base: keeps every batch and runs at one constant learning-rate multiplier
    (:attr:`lr_multiplier`, 1 unless :meth:`set_lr` changes it); subclasses choose ``deltas`` per offer."""

    name = "elastic"
    uses_truth = False
    lr_multiplier = 1.0

    def set_lr(self, multiplier: float) -> ElasticController:
        """Run at the constant learning-rate multiplier ``multiplier`` (in ``sim.elastic.LR_RANGE``)."""
        lo, hi = LR_RANGE
        self.lr_multiplier = check_range(f"{self.name}.lr_multiplier", multiplier, lo, hi)
        return self

    def reset(self, spec: ElasticSpec, rng: np.random.Generator | None = None) -> None:
        self.spec = spec
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def deltas(self, info: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True):
        d = np.clip(np.asarray(self.deltas(info), dtype=np.int64), -2, 2)
        action: dict[str, Any] = {"workers": d + 2, "lr": np.array([self.lr_multiplier], dtype=np.float32)}
        if self.spec.batch_action == "per_worker":
            n = self.spec.num_slots
            action["batch"] = (
                np.full(n, 2, dtype=np.int64) if self.spec.batch_mode == "delta" else np.zeros(n, np.float32)
            )
        return action, None


def _counts(info: dict[str, Any], spec: ElasticSpec, key: str) -> np.ndarray:
    return np.array([info[key][o] for o in spec.offers], dtype=np.int64)


class FixedAllocation(ElasticController):
    """Hold ``counts`` (``{offer: GPUs}``) throughout (start the env with the same allocation)."""

    name = "fixed"

    def __init__(self, counts: dict[str, int], label: str | None = None) -> None:
        if not isinstance(counts, dict) or not counts:
            raise ValueError(
                f"fixed allocation counts must be a non-empty {{offer: GPUs}} mapping, got {counts!r}"
            )
        self.counts = {str(k): check_int(f"counts[{k!r}]", v, 0) for k, v in counts.items()}
        if sum(self.counts.values()) < 1:
            raise ValueError(f"fixed allocation {counts} holds no GPU: the worker count must be at least one")
        self.label = label or "fixed:" + "+".join(f"{v}x{k}" for k, v in self.counts.items() if v)

    def reset(self, spec: ElasticSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        for k, v in self.counts.items():
            if k not in spec.offers:
                raise ValueError(f"fixed allocation offer {k!r} is not one of {list(spec.offers)}")
            cap = int(spec.capacity[spec.offers.index(k)])
            if v > cap:
                raise ValueError(
                    f"fixed allocation counts[{k!r}] = {v} is beyond the pool: allowed [0, {cap}]"
                )
        self.target = np.array([self.counts.get(o, 0) for o in spec.offers], dtype=np.int64)

    def deltas(self, info: dict[str, Any]) -> np.ndarray:
        held, free = _counts(info, self.spec, "held_counts"), _counts(info, self.spec, "free_counts")
        return np.minimum(self.target - held, free)


class GoodputPerDollar(ElasticController):
    """The goodput-per-dollar rule of the module docstring."""

    name = "goodput_per_dollar"

    def __init__(
        self,
        threshold: float = 2.0,
        shrink: float = 0.5,
        cooldown: int = 3,
        rate_smoothing: float = 0.3,
        max_changes: int = 4,
    ) -> None:
        self.max_changes = check_int("goodput_per_dollar.max_changes", max_changes, 1, 64)
        self.threshold = check_range("goodput_per_dollar.threshold", threshold, 0.0, 1e9)
        self.shrink = check_range("goodput_per_dollar.shrink", shrink, 0.0, 1.0)
        self.cooldown = check_int("goodput_per_dollar.cooldown", cooldown, 0, 10_000)
        self.rate_smoothing = check_range(
            "goodput_per_dollar.rate_smoothing", rate_smoothing, 0.0, 1.0, low_open=True
        )

    def reset(self, spec: ElasticSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.noise = NoiseScaleEstimator()
        self.rates: dict[str, float] = {}
        self.comm_s = 0.0
        self.since_change = self.cooldown

    def _observe(self, info: dict[str, Any]) -> None:
        rep = info["report"]
        self.noise.update(rep)
        alive = np.asarray(rep.alive, dtype=bool)
        comp = np.asarray(rep.compute_time_s)
        b = np.asarray(rep.local_batch, dtype=np.float64)
        gpus = np.array(self.spec.gpu_of_offer)[self.spec.slot_offer]
        for g in set(gpus[alive].tolist()):
            sel = alive & (gpus == g) & (comp > 0)
            if sel.any():
                r = float(np.median(b[sel] / comp[sel]))
                old = self.rates.get(g)
                self.rates[g] = r if old is None else old + self.rate_smoothing * (r - old)
        self.comm_s = float(rep.comm_time_s)
        self.batch = float(np.median(b[alive])) if alive.any() else float(np.median(b))

    def goodput(self, counts: np.ndarray) -> float:
        if counts.sum() < 1:
            return 0.0
        held_types = {self.spec.gpu_of_offer[k] for k in np.flatnonzero(counts)}
        if any(g not in self.rates for g in held_types):
            return math.nan
        t_iter = max(self.batch / self.rates[g] for g in held_types) + self.comm_s
        m = self.batch * float(counts.sum())
        m0 = self.spec.base_batch
        bn = self.noise.noise_scale or float(m0)
        return adascale_gain(m, m0, bn) / t_iter

    def deltas(self, info: dict[str, Any]) -> np.ndarray:
        self._observe(info)
        spec = self.spec
        held, free = _counts(info, spec, "held_counts"), _counts(info, spec, "free_counts")
        o = len(spec.offers)
        out = np.zeros(o, dtype=np.int64)
        self.since_change += 1
        if self.since_change <= self.cooldown:
            return out
        counts = held.copy()
        for _ in range(self.max_changes):
            rate_now = float(np.dot(counts, spec.price_usd_per_gpu_hour))
            risk = spec.preemptions_per_hour * spec.restart_s / 3600.0 * rate_now
            price = spec.price_usd_per_gpu_hour + np.where(spec.spot, risk, 0.0)
            g0 = self.goodput(counts)
            grow = np.full(o, -math.inf)
            keep = np.full(o, math.inf)
            for k in range(o):
                if counts[k] - held[k] < min(free[k], 2):
                    c = counts.copy()
                    c[k] += 1
                    g = self.goodput(c)
                    grow[k] = (g - g0) / max(price[k], 1e-9) if math.isfinite(g) else -math.inf
                if counts[k] > 0 and counts.sum() > 1 and held[k] - counts[k] < 2:
                    c = counts.copy()
                    c[k] -= 1
                    keep[k] = (g0 - self.goodput(c)) / max(price[k], 1e-9)
            k_best, k_worst = int(np.argmax(grow)), int(np.argmin(keep))
            if keep[k_worst] < self.shrink * self.threshold:
                counts[k_worst] -= 1
            elif grow[k_best] > self.threshold:
                counts[k_best] += 1
            else:
                break
        out = counts - held
        if out.any():
            self.since_change = 0
        return out


class PoolOracle(ElasticController):
    """The greedy oracle over the pool of the module docstring (reads ``info["elastic_truth"]``)."""

    name = "oracle_pool"
    uses_truth = True

    def __init__(self, time_value_usd_per_hour: float = 0.0, min_gain: float = 0.05) -> None:
        self.time_value = check_range(
            "oracle_pool.time_value_usd_per_hour", time_value_usd_per_hour, 0.0, 1e6
        )
        self.min_gain = check_range("oracle_pool.min_gain", min_gain, 0.0, 1.0)

    def _mask(self, info: dict[str, Any], deltas: np.ndarray) -> np.ndarray | None:
        held = np.asarray(info["held"], dtype=bool).copy()
        free = np.asarray(info["available"], dtype=bool)
        so = self.spec.slot_offer
        for k, d in enumerate(deltas.tolist()):
            slots = np.flatnonzero(so == k)
            if d > 0:
                cand = [s for s in slots if free[s]][:d]
                if len(cand) < d:
                    return None
                held[cand] = True
            elif d < 0:
                mine = [s for s in slots if held[s]]
                if len(mine) < -d:
                    return None
                held[mine[d:]] = False
        return held if held.any() else None

    def deltas(self, info: dict[str, Any]) -> np.ndarray:
        if "elastic_truth" not in info:
            raise RuntimeError(
                "oracle_pool needs info['elastic_truth'] (the elastic simulator's ground truth)"
            )
        truth = info["elastic_truth"]
        batches = np.asarray(info["local_batches"])
        spec = self.spec
        o = len(spec.offers)
        t_int_guess = None
        best, best_score, stay_score = np.zeros(o, dtype=np.int64), math.inf, math.inf
        cands = [np.zeros(o, dtype=np.int64)]
        for k in range(o):
            for d in (-2, -1, 1, 2):
                c = np.zeros(o, dtype=np.int64)
                c[k] = d
                cands.append(c)
        for c in cands:
            mask = self._mask(info, c)
            if mask is None:
                continue
            t = truth(mask, batches)
            if t["progress_per_s"] <= 0:
                continue
            t_int = spec.interval * t["iteration_time_s"]
            if t_int_guess is None:
                t_int_guess = t_int
            wall = t_int + (spec.restart_s if c.any() else 0.0)
            rate = float(np.dot(np.bincount(spec.slot_offer[mask], minlength=o), spec.price_usd_per_gpu_hour))
            score = (rate + self.time_value) * wall / 3600.0 / (t["progress_per_s"] * t_int)
            if not c.any():
                stay_score = score
            if score < best_score:
                best, best_score = c, score
        if best.any() and best_score > (1.0 - self.min_gain) * stay_score:
            return np.zeros(o, dtype=np.int64)
        return best


class SpotBackfill(ElasticController):
    """The spot-first heuristic of the module docstring."""

    name = "spot_backfill"

    def __init__(
        self,
        gpu: str = "T4",
        gpus: int = 4,
        on_demand: int = 0,
        swap_on_notice: bool = False,
        hand_back: bool = True,
    ) -> None:
        self.gpu = str(gpu)
        self.gpus = check_int("spot_backfill.gpus", gpus, 1, 4096)
        self.on_demand = check_int("spot_backfill.on_demand", on_demand, 0, self.gpus)
        for name, value in (("swap_on_notice", swap_on_notice), ("hand_back", hand_back)):
            if not isinstance(value, bool):
                raise ValueError(f"spot_backfill.{name} must be true or false, got {value!r}")
        self.swap_on_notice, self.hand_back = swap_on_notice, hand_back

    def reset(self, spec: ElasticSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        for market in ("spot", "on_demand"):
            if f"{self.gpu}/{market}" not in spec.offers:
                raise ValueError(f"spot_backfill.gpu={self.gpu!r}: the pool has no {self.gpu}/{market} offer")
        self.k_spot = spec.offers.index(f"{self.gpu}/spot")
        self.k_od = spec.offers.index(f"{self.gpu}/on_demand")
        self.replaced = 0  # on-demand GPUs requested to replace spot ones (kept when not handing back)

    def deltas(self, info: dict[str, Any]) -> np.ndarray:
        spec = self.spec
        ks, ko = self.k_spot, self.k_od
        held, free = _counts(info, spec, "held_counts"), _counts(info, spec, "free_counts")
        # Spot GPUs under a notice are as good as gone (the pool releases those first).
        noticed = _counts(info, spec, "noticed_counts")[ks] if self.swap_on_notice else 0
        floor = self.on_demand if self.hand_back else min(self.gpus, self.on_demand + self.replaced)
        target = np.zeros(len(spec.offers), dtype=np.int64)
        target[ks] = min(self.gpus - floor, held[ks] - noticed + free[ks])
        target[ko] = min(self.gpus - target[ks], held[ko] + free[ko])
        d = np.clip(target - held, -2, 2)
        if d[ks] > 0 and d[ko] < 0:
            d[ko] = max(d[ko], -d[ks])  # hand back only what spot replaced
        if d[ko] > 0:
            self.replaced += int(d[ko])
        return d


def make_elastic_controller(name: str, lr_multiplier: float = 1.0, **kwargs: Any) -> ElasticController:
    """A baseline by name: ``fixed`` (``counts=``), ``goodput_per_dollar``, ``oracle_pool``,
    ``spot_backfill``; each at the constant learning-rate multiplier ``lr_multiplier``."""
    kinds = {
        "fixed": FixedAllocation,
        "goodput_per_dollar": GoodputPerDollar,
        "oracle_pool": PoolOracle,
        "spot_backfill": SpotBackfill,
    }
    if name not in kinds:
        raise ValueError(f"elastic controller {name!r} is not one of {list(ELASTIC_BASELINES)}")
    return kinds[name](**kwargs).set_lr(lr_multiplier)
