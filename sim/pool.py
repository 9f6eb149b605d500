"""A pool of rentable GPUs: node types, how many of each are available on demand and on the spot
market, their hourly prices, spot preemptions and the cost of an elastic restart.

Prices are data: a pool comes from a config (``sim/data/pool/*.yaml``) that records where its prices
were read and when (``price_source``, ``price_date``); nothing here holds a price.

The pool's *slots* are every GPU it could ever lend, grouped by offer (node type x market) and
packed onto nodes of the type's instance size (``sim.cluster.GPUS_PER_NODE``, or ``per_node``). The
simulator of an elastic job is built on all slots; the job holds a subset of them (``sim.elastic``).

A pool may name a calibrated cluster profile (``profile``, :mod:`sim.profile`): its node types may
then be the profile's worker types (e.g. ``cpu``, a CPU rank of the machine the profile measured),
whose models and node sizes come from the profile, and the job trains the profile's workload unless
told otherwise. Such a pool can be simulated and run on real ranks alike.

    cost rate ($/h)   = sum over held slots of the slot's price per GPU-hour
    spot preemption   : per spot slot, candidate times ~ Poisson(rate_per_hour); a held slot at a
                        candidate time gets a notice, then is lost notice_s later, and its capacity
                        returns after U(unavailable_s)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.cluster import GPUS_PER_NODE, ClusterSpec, NodeSpec
from sim.specs_io import spec_from_dict
from sim.validation import check_choice, check_int, check_min_max, check_range

MARKETS = ("on_demand", "spot")
_REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PoolNodeType:
    """One GPU type of the pool: GPUs available per market and the price of one GPU-hour in each."""

    gpu: str
    on_demand: int  # GPUs available on demand
    spot: int  # GPUs available on the spot market
    on_demand_usd_per_gpu_hour: float
    spot_usd_per_gpu_hour: float
    per_node: int = 0  # GPUs (workers) per node; 0: the type's instance size

    def check(self, where: str, known_types=GPUS_PER_NODE) -> None:
        check_choice(f"{where}.gpu (node type)", self.gpu, known_types)
        check_int(f"{where}.per_node (GPUs per node; 0: the type's instance size)", self.per_node, 0, 4096)
        check_int(f"{where}.on_demand (GPUs available)", self.on_demand, 0, 4096)
        check_int(f"{where}.spot (GPUs available)", self.spot, 0, 4096)
        check_range(f"{where}.on_demand_usd_per_gpu_hour", self.on_demand_usd_per_gpu_hour, 0.0, 1e4)
        check_range(f"{where}.spot_usd_per_gpu_hour", self.spot_usd_per_gpu_hour, 0.0, 1e4)


@dataclass(frozen=True)
class PreemptionSpec:
    """Spot preemptions: candidate times per spot slot ~ Poisson(``rate_per_hour``); a held slot is
    warned ``notice_s`` before it is lost (GCP gives 30 s, AWS 120 s); its capacity returns after
    U(``unavailable_s``)."""

    rate_per_hour: float = 0.0
    notice_s: float = 30.0
    unavailable_s: tuple[float, float] = (300.0, 1200.0)

    def check(self, where: str) -> None:
        check_range(f"{where}.rate_per_hour", self.rate_per_hour, 0.0, 3600.0)
        check_range(f"{where}.notice_s", self.notice_s, 0.0, 3600.0)
        if len(self.unavailable_s) != 2:
            raise ValueError(f"{where}.unavailable_s must be a (min, max) pair, got {self.unavailable_s!r}")
        check_range(f"{where}.unavailable_s[0]", self.unavailable_s[0], 0.0, 1e7)
        check_range(f"{where}.unavailable_s[1]", self.unavailable_s[1], 0.0, 1e7)
        check_min_max(
            f"{where}.unavailable_s[0]",
            self.unavailable_s[0],
            f"{where}.unavailable_s[1]",
            self.unavailable_s[1],
        )


@dataclass(frozen=True)
class PoolSpec:
    """GPUs to rent: node types, spot preemptions and the elastic restart cost.

    ``restart_s`` is the time to re-form the process group at a new size and reload the last
    checkpoint, paid whenever the held set changes (a request, a release or a preemption); the
    simulator's restart model (``SlowdownSpec.restart_delay_s``) pays the same for a lost worker.
    ``initial`` is the allocation a job starts with: ``{offer: count}``, offers named
    ``"<gpu>/<market>"`` (e.g. ``"T4/spot"``).
    """

    name: str
    node_types: tuple[PoolNodeType, ...]
    preemption: PreemptionSpec = field(default_factory=PreemptionSpec)
    restart_s: float = 30.0
    initial: tuple[tuple[str, int], ...] = ()
    price_source: str = ""
    price_date: str = ""
    profile: str = ""  # a calibrated cluster profile (sim.profile) whose worker types node_types may name

    def __post_init__(self) -> None:
        if not self.node_types:
            raise ValueError(f"pool {self.name!r}: node_types must list at least one node type")
        known = dict(GPUS_PER_NODE)
        if self.profile:
            known.update({node.gpu: node.gpus for node in self.load_profile().cluster.nodes})
        for i, nt in enumerate(self.node_types):
            nt.check(f"pool.node_types[{i}]", known)
        gpus = [nt.gpu for nt in self.node_types]
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"pool.node_types lists a node type twice: {gpus}")
        if self.num_slots < 1:
            raise ValueError("pool.node_types: the pool has no GPU at all (every on_demand and spot is 0)")
        self.preemption.check("pool.preemption")
        check_range("pool.restart_s", self.restart_s, 0.0, 1e5)
        if not self.price_source or not self.price_date:
            raise ValueError(
                "pool.price_source and pool.price_date must say where and when the prices were read"
            )
        offers = self.offers
        total = 0
        for k, (name, count) in enumerate(self.initial):
            check_choice(f"pool.initial[{k}] offer", name, offers)
            cap = self.capacity(name)
            check_int(f"pool.initial[{k}] ({name}) GPUs", count, 0, cap)
            total += count
        if self.initial and total < 1:
            raise ValueError(
                f"pool.initial must hold at least one GPU in all (a worker count below one): {self.initial}"
            )

    def load_profile(self):
        """The pool's :class:`sim.profile.ClusterProfile` (``None`` without one); a relative path is
        read from the launch directory, else from the repository root."""
        if not self.profile:
            return None
        from sim.profile import load_profile  # the profile module imports the simulator's models

        ref = Path(self.profile)
        if not ref.is_absolute() and not ref.exists() and (_REPO_ROOT / ref).exists():
            ref = _REPO_ROOT / ref
        try:
            return load_profile(ref if ref.exists() else self.profile)
        except FileNotFoundError as err:
            raise ValueError(f"pool.profile: {err}") from None

    # --- offers and slots ----------------------------------------------------------------------------
    @property
    def offers(self) -> tuple[str, ...]:
        """``"<gpu>/<market>"`` for every node type and market, in order."""
        return tuple(f"{nt.gpu}/{m}" for nt in self.node_types for m in MARKETS)

    def _node_type(self, offer: str) -> tuple[PoolNodeType, str]:
        check_choice("offer", offer, self.offers)
        gpu, market = offer.split("/")
        return next(nt for nt in self.node_types if nt.gpu == gpu), market

    def capacity(self, offer: str) -> int:
        nt, market = self._node_type(offer)
        return nt.on_demand if market == "on_demand" else nt.spot

    def price(self, offer: str) -> float:
        """US dollars per GPU-hour of ``offer``."""
        nt, market = self._node_type(offer)
        return nt.on_demand_usd_per_gpu_hour if market == "on_demand" else nt.spot_usd_per_gpu_hour

    @property
    def num_slots(self) -> int:
        return sum(nt.on_demand + nt.spot for nt in self.node_types)

    @property
    def slot_offer(self) -> np.ndarray:
        """(slots,) index into :attr:`offers` of every slot."""
        return np.repeat(np.arange(len(self.offers)), [self.capacity(o) for o in self.offers])

    @property
    def slot_price_usd_per_hour(self) -> np.ndarray:
        return np.array([self.price(o) for o in self.offers])[self.slot_offer]

    @property
    def slot_is_spot(self) -> np.ndarray:
        return np.array([o.endswith("/spot") for o in self.offers])[self.slot_offer]

    def slot_cluster(self) -> ClusterSpec:
        """Every slot as a worker, offer by offer, on full nodes of the type's instance size (a
        profile's worker type: on nodes like the profile's)."""
        profile = self.load_profile()
        profiled = {node.gpu: node for node in profile.cluster.nodes} if profile is not None else {}
        nodes = []
        for offer in self.offers:
            gpu = offer.split("/")[0]
            nt = next(t for t in self.node_types if t.gpu == gpu)
            like = profiled.get(gpu) if gpu not in GPUS_PER_NODE else None
            default = like.gpus if like is not None else GPUS_PER_NODE[gpu]
            count, per_node = self.capacity(offer), nt.per_node or default
            while count > 0:
                k = min(per_node, count)
                nodes.append(replace(like, gpus=k) if like is not None else NodeSpec(gpu=gpu, gpus=k))
                count -= per_node
        return ClusterSpec(name=f"pool:{self.name}", nodes=tuple(nodes))

    def initial_counts(self) -> np.ndarray:
        """(offers,) GPUs of each offer held at the start (default: one GPU of the first offer)."""
        counts = np.zeros(len(self.offers), dtype=np.int64)
        if not self.initial:
            counts[next(i for i, o in enumerate(self.offers) if self.capacity(o) > 0)] = 1
        for name, c in self.initial:
            counts[self.offers.index(name)] += int(c)
        return counts


def pool_from_dict(data: Mapping[str, Any]) -> PoolSpec:
    """A pool from its config mapping; ``initial`` may be given as ``{offer: count}``.

    Raises:
        ValueError: an unknown key, node type, offer, a negative price or count (naming the field).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"pool must be a mapping, got {type(data).__name__}")
    data = dict(data)
    measured = data.pop("restart_measured", None)
    if measured is not None:
        if "restart_s" in data:
            raise ValueError("pool: give restart_s or restart_measured (a measured restart file), not both")
        data["restart_s"] = measured_restart_s(measured)
    initial = data.get("initial")
    if isinstance(initial, Mapping):
        data["initial"] = [[str(k), v] for k, v in initial.items()]
    return spec_from_dict(PoolSpec, data, "pool")


def measured_restart_s(path: str | Path) -> float:
    """The median measured restart time (s) of a ``python -m experiments.elastic_real`` result file
    (``median_restart_s``); a relative path is read from the launch directory, else the repository.

    Raises:
        ValueError: no such file, or a file without a positive ``median_restart_s`` (naming the field).
    """
    import json

    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = _REPO_ROOT / p
    if not p.is_file():
        raise ValueError(
            f"pool.restart_measured: no file {str(path)!r} (python -m experiments.elastic_real writes one)"
        )
    value = json.loads(p.read_text(encoding="utf-8")).get("median_restart_s")
    if not isinstance(value, int | float) or not 0.0 < float(value) < 1e5:
        raise ValueError(
            f"pool.restart_measured: {str(path)!r} has no median_restart_s in (0, 1e5), got {value!r}"
        )
    return float(value)
