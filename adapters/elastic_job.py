"""A rented pool of real ranks: :class:`sim.elastic.ElasticJob`'s interface over
:class:`~adapters.elastic.ElasticDDPBackend`, so that ``dynamix/ElasticCluster-v0`` (its observation,
actions and rewards, unchanged) drives real training whose world size follows the policy.

    python -m experiments.elastic_policy_real      # controllers and a learned bundle on real ranks

The pool (``sim/data/pool/cpu_local.yaml``) names a calibrated profile whose worker type its slots are:
the simulator runs the same pool through that profile, so a policy trained there meets the same
slots, offers and prices here. Every slot the job holds is one rank, in slot order; a change of the
held set re-forms the group from the last checkpoint (:meth:`ElasticDDPBackend.resize`, measured);
the spend is every held slot's price over the job's wall clock, restarts included (the job pays
for the GPUs it holds while it re-forms, as the simulated job does); the learning-rate multiplier
scales the lr rule's learning rate on every rank.

Spot preemptions are emulated on the job's wall clock from the pool's ``preemption`` spec, with the
simulated job's rules (:class:`SpotPreemptions`): per spot slot, candidate times ~ Poisson(rate); a
held slot at a candidate time gets a notice, is lost ``notice_s`` later and is available again
after U(``unavailable_s``). The job checks the clock at every interval boundary: a notice shows in
the next observation, and a rank whose loss time has passed leaves the group at that boundary (at
most one interval late), re-forming it from a fresh checkpoint as a job that uses its notice to
checkpoint would; a release during the notice avoids that forced restart, as in simulation.
"""

from __future__ import annotations

import heapq
import logging
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from adapters.config import RealDDPConfig, real_config_of
from adapters.elastic import ElasticDDPBackend
from dynamix_gym.elastic.pools import get_pool
from sim.elastic import LR_RANGE, PoolEvent, PoolLedger, check_deltas, initial_held, pick_slots
from sim.engine import Simulator
from sim.pool import PoolSpec
from sim.protocol import WORKER_FIELDS, BackendSpec, IntervalReport
from sim.validation import check_range

log = logging.getLogger(__name__)


def pool_worker_type(pool: PoolSpec) -> str:
    """The one worker type of ``pool``'s slots (real ranks of one machine are alike).

    Raises:
        ValueError: a pool with slots of more than one type.
    """
    types = sorted({o.split("/")[0] for o in pool.offers if pool.capacity(o) > 0})
    if len(types) != 1:
        raise ValueError(f"pool.node_types: real ranks of one machine are one worker type, got {types}")
    return types[0]


class SpotPreemptions:
    """The preemptions of ``pool``'s spot slots on a job's clock, drawn from ``rng`` by the rules of
    :class:`sim.elastic.ElasticJob` (per slot: wait ~ Exp(3600 / rate_per_hour) s; at that candidate
    time a held, available slot gets a notice, is lost ``notice_s`` later and returns after
    U(``unavailable_s``); a candidate that finds the slot not held draws the next one).

    :meth:`advance` moves the clock to ``now`` and returns what happened, in time order, as
    ``(time_s, kind, slot)`` with kind ``notice``, ``loss`` or ``available``; ``held(slot)`` says
    whether the job held the slot (a notice or a loss of a slot not held is not an event).
    """

    def __init__(self, pool: PoolSpec, rng: np.random.Generator) -> None:
        self.spec = pool.preemption
        self._rng = rng
        self._queue: list[tuple[float, int, str]] = []
        if self.spec.rate_per_hour > 0:
            for slot in np.flatnonzero(pool.slot_is_spot):
                heapq.heappush(self._queue, (self._wait(), int(slot), "candidate"))

    def _wait(self) -> float:
        return float(self._rng.exponential(3600.0 / self.spec.rate_per_hour))

    def advance(self, now: float, held) -> list[tuple[float, str, int]]:
        out: list[tuple[float, str, int]] = []
        lo, hi = self.spec.unavailable_s
        while self._queue and self._queue[0][0] <= now:
            t, slot, phase = heapq.heappop(self._queue)
            if phase == "candidate":
                away = lo if lo == hi else float(self._rng.uniform(lo, hi))
                if held(slot):
                    out.append((t, "notice", slot))
                    heapq.heappush(self._queue, (t + self.spec.notice_s, slot, f"loss:{away!r}"))
                else:
                    heapq.heappush(self._queue, (t + self._wait(), slot, "candidate"))
            elif phase.startswith("loss:"):
                out.append((t, "loss", slot))
                heapq.heappush(self._queue, (t + float(phase[5:]), slot, "available"))
            else:
                out.append((t, "available", slot))
                heapq.heappush(self._queue, (t + self._wait(), slot, "candidate"))
        return out


class RealElasticJob(PoolLedger):
    """A job holding some of ``pool``'s slots as real ranks (the interface of :class:`ElasticJob`).

    Args:
        pool: the pool (one worker type; spot preemptions emulated, see the module docstring).
        config: the ranks' :class:`RealDDPConfig` (``workers`` is set from the held slots; scalar
            ``min_batch`` / ``max_batch``); ``checkpoint_dir`` holds one folder per episode.
    """

    def __init__(self, pool: PoolSpec, config: RealDDPConfig) -> None:
        self.worker_type = pool_worker_type(pool)
        if not config.checkpoint_dir:
            raise ValueError("RealElasticJob needs config.checkpoint_dir (restarts resume from it)")
        self.config = config
        self._init_pool(pool)
        self.backend: ElasticDDPBackend | None = None
        self._episodes = 0
        self._held = initial_held(pool)

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    # --- lifecycle -----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """A fresh run (new ranks, a new checkpoint folder) holding the pool's initial allocation."""
        self.close()
        self._held = initial_held(self.pool)
        folder = Path(self.config.checkpoint_dir) / f"episode-{self._episodes}"
        self._episodes += 1
        cfg = replace(self.config, workers=int(self._held.sum()), checkpoint_dir=str(folder), resume=False)
        self.backend = ElasticDDPBackend(cfg, max_workers=self.num_slots)
        if rng is None:
            rng = np.random.default_rng(seed)
        pre_rng, run_rng = rng.spawn(2)  # preemptions from their own stream, as in simulation
        self.backend.reset(rng=run_rng)
        self._preemptions = SpotPreemptions(self.pool, pre_rng)
        self._open_ledger(self._held)
        self.lr_multiplier = 1.0

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None

    # --- what the job holds and spends ---------------------------------------------------------------
    @property
    def held(self) -> np.ndarray:
        return self._held.copy()

    def now_s(self) -> float:
        return float(self._live().inner.wall_time_s())

    # --- decisions -----------------------------------------------------------------------------------
    def change(self, deltas) -> dict[str, list]:
        """Request or release ``deltas[k]`` slots of offer k and re-form the group at the new size.

        Raises:
            ValueError: as :meth:`sim.elastic.ElasticJob.change` (nothing changes).
            RuntimeError: a restart that failed (the last complete checkpoint stays in force).
        """
        backend = self._live()
        d = check_deltas(deltas, self.offers, self.held_counts(), self.free_counts(), self.capacity)
        added, removed = pick_slots(d, self.slot_offer, self._held, self.available, self.noticed)
        mask = self._held.copy()
        mask[added] = True
        mask[removed] = False
        if np.array_equal(mask, self._held):
            return {"added": [], "removed": []}
        now = self.now_s()
        # Raises before anything below changes. A swap at the same size keeps the group: the
        # ranks of one worker type are alike, so nothing is re-formed and no restart is counted.
        restarted = backend.resize(int(mask.sum())) > 0
        for s in removed:
            self._bill(s, now)
            self.noticed[s] = False
            self.log.append(PoolEvent(now, "release", s, self.offers[self.slot_offer[s]]))
        for s in added:
            self._held_since[s] = now
            self.log.append(PoolEvent(now, "request", s, self.offers[self.slot_offer[s]]))
        self._held = mask
        self.restarts += int(restarted)
        return {"added": added, "removed": removed}

    def set_lr_multiplier(self, multiplier: float) -> None:
        m = check_range("lr_multiplier", multiplier, *LR_RANGE)
        self.lr_multiplier = m
        self._live().inner.lr_multiplier = m

    def run_interval(self, local_batches, iterations: int) -> IntervalReport:
        """``iterations`` iterations of the held ranks at their slots' entries of ``local_batches``;
        the report covers the ranks only (:class:`RealElasticBackend` spreads it over the slots)."""
        self.poll()
        b = np.asarray(local_batches, dtype=np.int64)
        report = self._live().run_interval(b[self._held], iterations)
        self.poll()  # notices during the interval show in the next observation
        return report

    def poll(self) -> None:
        """Apply the preemptions due by now: notices, losses (the group re-formed without the lost
        ranks; the cheapest free on-demand slot replaces the last one) and capacity coming back."""
        backend = self._live()
        for _ in range(self.num_slots + 1):  # a forced restart takes time: events may fall due in it
            events = self._preemptions.advance(self.now_s(), lambda s: bool(self._held[s]))
            if not events:
                return
            mask = self._held.copy()
            for t, kind, s in events:
                offer = self.offers[self.slot_offer[s]]
                if kind == "notice":
                    self.noticed[s] = True
                    self.log.append(PoolEvent(t, "notice", s, offer))
                elif kind == "available":
                    self.available[s] = True
                    self.log.append(PoolEvent(t, "available", s, offer))
                else:
                    self.noticed[s] = False
                    self.available[s] = False
                    if mask[s]:
                        self._bill(s, t)
                        mask[s] = False
                        self.log.append(PoolEvent(t, "preempt", s, offer))
            if mask.sum() == 0:
                mask[self._replacement(mask, self.now_s())] = True
            if not np.array_equal(mask, self._held):
                self.restarts += int(backend.resize(int(mask.sum())) > 0)
                self._held = mask

    @property
    def restart_times_s(self) -> list[float]:
        return [r["restart_s"] for r in self._live().restarts]

    def _live(self) -> ElasticDDPBackend:
        if self.backend is None:
            raise RuntimeError("RealElasticJob.reset() must be called first")
        return self.backend


class RealElasticBackend:
    """``dynamix/ElasticCluster-v0``'s backend over real ranks of ``pool``'s slots.

    Args:
        pool: a pool name (``sim/data/pool``), mapping or :class:`PoolSpec` naming a calibrated profile
            measured on the real backend (default ``cpu_local``).
        config: the ranks' :class:`RealDDPConfig` (default: the one the profile was measured on).
        checkpoint_dir: where the episodes' checkpoints go (default: a temporary folder removed by
            :meth:`close`).
        **overrides: :class:`RealDDPConfig` fields replacing the default config's.
    """

    def __init__(
        self,
        pool: str | dict | PoolSpec = "cpu_local",
        config: RealDDPConfig | None = None,
        *,
        checkpoint_dir: str | None = None,
        **overrides: Any,
    ) -> None:
        self.pool = get_pool(pool)
        worker_type = pool_worker_type(self.pool)
        profile = self.pool.load_profile()
        if config is None:
            if profile is None:
                raise ValueError("RealElasticBackend needs a config, or a pool with a profile (pool.profile)")
            config = RealDDPConfig(**real_config_of(profile))
        self._tmp = None if checkpoint_dir else tempfile.mkdtemp(prefix="dynamix-elastic-")
        config = replace(config, **overrides, checkpoint_dir=checkpoint_dir or self._tmp)
        self.job = RealElasticJob(self.pool, config)
        n = self.pool.num_slots
        node_of_worker = tuple(
            i for i, node in enumerate(self.pool.slot_cluster().nodes) for _ in range(node.gpus)
        )
        full = lambda v: np.full(n, int(v), dtype=np.int64)  # noqa: E731
        self.spec = BackendSpec(
            gpu_types=(worker_type,) * n,
            node_of_worker=node_of_worker,
            min_batch=full(config.min_batch),
            max_batch=full(config.max_batch),
            initial_batch=full(config.initial_batch or config.base_batch),
            base_batch=int(config.base_batch),
            target_accuracy=config.target_quality,
            time_budget_s=float(config.time_budget_s),
            num_classes=config.task.num_classes,
            workload=profile.workload.name if profile is not None else f"{config.model}/{config.dataset}",
            deterministic=False,
            metric=config.task.metric,
            lr_rule=config.lr_rule,
        )
        # throughput_max of the scheduler reward: the calibrated model of the slots (a profile), else 0.
        self._model = None
        if profile is not None:
            self._model = Simulator(self.pool.slot_cluster(), profile=profile)
            self._model.reset(seed=0)  # its noise-free compute model is all that is read
        self.ground_truth = None  # real training has no noise-free model to query

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        self.job.reset(seed, rng=rng)

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        b = np.asarray(local_batches, dtype=np.int64)
        if b.shape != (self.pool.num_slots,):
            raise ValueError(
                f"local_batches must have one entry per slot ({self.pool.num_slots}), got {b.shape}"
            )
        held = self.job.held
        report = self.job.run_interval(b, iterations)
        spread: dict[str, np.ndarray] = {}
        for name in WORKER_FIELDS:
            ranks = np.asarray(getattr(report, name))
            out = np.zeros(b.shape, dtype=ranks.dtype)
            out[held] = ranks
            spread[name] = out
        spread["local_batch"][~held] = b[~held]  # a slot not held keeps its batch, as in simulation
        out = replace(report, **spread)
        out.validate()
        return out

    def ideal_throughput(self) -> float:
        """Samples/s of every slot at its largest batch by the profile's calibrated model (0 without one)."""
        if self._model is None:
            return 0.0
        b = self.spec.max_batch
        return float(np.sum(b / self._model.compute_time_s(b)))

    def close(self) -> None:
        self.job.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
