"""An elastic training job on a rented pool: it holds some of the pool's GPUs, pays for them by
the second, loses spot GPUs to preemptions and restarts its process group whenever its set changes.

The job wraps a :class:`sim.engine.Simulator` built on every slot of the pool; the slots it does not
hold are outside the training group (the engine's ``held`` mask). Spot preemptions are SimPy
processes on the simulator's clock, so a loss splits an interval exactly where it falls, as any
fault does. Their draws come from their own child stream of the run's generator, one candidate
time after another per spot slot (Poisson thinning: a candidate preempts the slot only if the job
holds it then), so the other faults and the noise unfold identically whatever a controller holds,
and a slot's candidates shift only after it was itself preempted.

    spend_usd(t)  = sum over held periods [t0, t1) of slot price_usd_per_gpu_hour * (t1 - t0) / 3600
    restart       : every change of the held set stalls the job pool.restart_s (re-forming the group
                    and reloading the checkpoint), paid before the next iteration
    lr multiplier : m scales the rule's learning rate; progress per step is multiplied by
                    g(m) = m^a exp(-(m - 1)^2 / (2 w^2))  (g(1) = 1; w = lr_tolerance,
                    a = lr_exponent; by default both as fitted to real training by
                    ``python -m experiments.fit_lr_response``, sim/data/lr_response.json: the
                    digits CNN on a CPU rank, the one task that trains here, standing in for the
                    pool's GPU workload)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sim.datafiles import data_path, load_json
from sim.engine import Simulator
from sim.faults import Scenario
from sim.pool import PoolSpec
from sim.protocol import IntervalReport
from sim.validation import check_int, check_range
from sim.workloads import Workload

log = logging.getLogger(__name__)

#: Learning-rate multipliers the job accepts.
LR_RANGE = (0.8, 1.25)


@dataclass(frozen=True)
class PoolEvent:
    """One line of the pool log: a request, release, notice, preemption or return of capacity."""

    time_s: float
    kind: str  # request | release | notice | preempt | replace | available
    slot: int
    offer: str

    def __str__(self) -> str:
        return f"t={self.time_s:.1f}s {self.kind} slot {self.slot} ({self.offer})"


def lr_progress_gain(multiplier: float, tolerance: float, exponent: float = 1.0) -> float:
    """g(m) = m^a exp(-(m - 1)^2 / (2 w^2)) (a = ``exponent``: 1, progress in proportion to the
    learning rate; 0, insensitive to it but for the penalty of straying; w = ``tolerance``). g(1) = 1:
    the convergence models were fitted at the rule's own learning rate."""
    return multiplier**exponent * math.exp(-((multiplier - 1.0) ** 2) / (2.0 * tolerance**2))


def fitted_lr_response() -> tuple[float, float]:
    """(``lr_tolerance``, ``lr_exponent``) fitted by ``python -m experiments.fit_lr_response``
    (``sim/data/lr_response.json``)."""
    doc = load_json(str(data_path("lr_response.json")))
    return float(doc["lr_tolerance"]), float(doc["lr_exponent"])


def initial_held(pool: PoolSpec) -> np.ndarray:
    """(slots,) the slots a job holds at the start: the first ``initial`` slots of every offer."""
    held = np.zeros(pool.num_slots, dtype=bool)
    slot_offer = pool.slot_offer
    for k, count in enumerate(pool.initial_counts()):
        held[np.flatnonzero(slot_offer == k)[:count]] = True
    return held


def check_deltas(deltas, offers, held: np.ndarray, free: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``deltas`` (GPUs requested (+) or released (-) per offer) as integers, checked against what the
    job holds (``held``), what the pool has free (``free``) and the one-GPU minimum.

    Raises:
        ValueError: a delta that is not an integer, a request beyond the GPUs free in the pool or a
            release beyond those held, or a result below one GPU in all (each naming the offer, the
            field and the allowed range).
    """
    d = np.asarray(deltas)
    if d.shape != (len(offers),):
        raise ValueError(f"deltas must have one entry per offer {list(offers)}, got shape {d.shape}")
    out = np.zeros(len(offers), dtype=np.int64)
    for k, offer in enumerate(offers):
        v = check_int(f"deltas[{k}] ({offer})", d[k].item() if hasattr(d[k], "item") else d[k])
        if v > free[k]:
            raise ValueError(
                f"deltas[{k}] ({offer}) requests {v} GPUs, beyond the pool: {int(free[k])} free of "
                f"{int(capacity[k])}; allowed range [{-int(held[k])}, {int(free[k])}]"
            )
        if -v > held[k]:
            raise ValueError(
                f"deltas[{k}] ({offer}) releases {-v} GPUs, the job holds {int(held[k])}; "
                f"allowed range [{-int(held[k])}, {int(free[k])}]"
            )
        out[k] = v
    total = int(held.sum() + out.sum())
    if total < 1:
        raise ValueError(
            f"deltas {out.tolist()} leave {total} GPUs: the job needs at least one (worker count)"
        )
    return out


def pick_slots(
    deltas: np.ndarray, slot_offer: np.ndarray, held: np.ndarray, available: np.ndarray, noticed: np.ndarray
) -> tuple[list[int], list[int]]:
    """(slots added, slots removed) for checked ``deltas``: requests take the first free available
    slots of the offer; releases give back the slots under a preemption notice first, then the newest."""
    added: list[int] = []
    removed: list[int] = []
    for k, v in enumerate(int(x) for x in deltas):
        slots = np.flatnonzero(slot_offer == k)
        if v > 0:
            added += [int(s) for s in slots if not held[s] and available[s]][:v]
        elif v < 0:
            mine = [int(s) for s in slots if held[s]]
            mine.sort(key=lambda s: (not noticed[s], -s))
            removed += mine[:-v]
    return added, removed


class PoolLedger:
    """What a job on a pool holds, owes and has logged: the part of a job's interface that the
    simulated job (:class:`ElasticJob`) and the real one (``adapters.elastic_job.RealElasticJob``)
    share. A subclass provides ``held`` (a (slots,) mask) and ``now_s()`` (its clock, in seconds)."""

    def _init_pool(self, pool: PoolSpec) -> None:
        self.pool = pool
        self.offers = pool.offers
        self.slot_offer = pool.slot_offer
        self.slot_price = pool.slot_price_usd_per_hour
        self.slot_spot = pool.slot_is_spot
        self.capacity = np.array([pool.capacity(o) for o in self.offers], dtype=np.int64)
        self.offer_price = np.array([pool.price(o) for o in self.offers])

    def _open_ledger(self, held: np.ndarray) -> None:
        """A fresh run holding ``held`` from time zero: no spend, no events, every slot available."""
        n = self.pool.num_slots
        self.available = np.ones(n, dtype=bool)  # capacity not lost to a preemption
        self.noticed = np.zeros(n, dtype=bool)
        self._held_since = np.where(held, 0.0, math.nan)
        self._spent = 0.0
        self.log: list[PoolEvent] = []
        self._log_cursor = 0
        self.restarts = 0

    def held_counts(self) -> np.ndarray:
        """(offers,) GPUs held of each offer."""
        return np.bincount(self.slot_offer[self.held], minlength=len(self.offers))

    def free_counts(self) -> np.ndarray:
        """(offers,) GPUs of each offer that could be requested now."""
        free = self.available & ~self.held
        return np.bincount(self.slot_offer[free], minlength=len(self.offers))

    def noticed_counts(self) -> np.ndarray:
        return np.bincount(self.slot_offer[self.noticed & self.held], minlength=len(self.offers))

    def spend_usd(self) -> float:
        """Dollars spent up to now."""
        now, held = self.now_s(), self.held
        running = float(np.sum(self.slot_price[held] * (now - self._held_since[held])) / 3600.0)
        return self._spent + running

    def cost_rate_usd_per_hour(self) -> float:
        return float(self.slot_price[self.held].sum())

    def new_events(self) -> list[PoolEvent]:
        out = self.log[self._log_cursor :]
        self._log_cursor = len(self.log)
        return out

    def _bill(self, slot: int, now: float) -> None:
        self._spent += float(self.slot_price[slot] * (now - self._held_since[slot]) / 3600.0)
        self._held_since[slot] = math.nan

    def _replacement(self, mask: np.ndarray, now: float) -> int:
        """The slot that replaces the last one lost at ``now`` (the job never runs on zero GPUs): the
        cheapest free on-demand one, else the cheapest free one; held and billed from ``now``."""
        free = np.flatnonzero(self.available & ~mask & ~self.slot_spot)
        if free.size == 0:
            free = np.flatnonzero(self.available & ~mask)
        if free.size == 0:
            raise RuntimeError("every GPU of the pool is preempted or unavailable: the job cannot continue")
        s = int(free[np.argmin(self.slot_price[free])])
        self._held_since[s] = now
        self.log.append(PoolEvent(now, "replace", s, self.offers[self.slot_offer[s]]))
        return s


class ElasticJob(PoolLedger):
    """Data-parallel training of ``workload`` on GPUs rented from ``pool``.

    Args:
        pool: the :class:`PoolSpec`.
        workload: as for :class:`Simulator`.
        scenario: as for :class:`Simulator` (faults act on every slot).
        lr_tolerance: w of the learning-rate response (see the module docstring; ``None``: the
            fitted one of ``sim/data/lr_response.json``).
        lr_exponent: a of the learning-rate response (``None``: the fitted one).
        **sim_kwargs: passed to :class:`Simulator` (``profile`` defaults to the pool's).
    """

    def __init__(
        self,
        pool: PoolSpec,
        workload: str | Workload | None = None,
        scenario: str | Scenario = "static_hetero",
        *,
        lr_tolerance: float | None = None,
        lr_exponent: float | None = None,
        **sim_kwargs,
    ) -> None:
        self._init_pool(pool)
        if pool.profile and "profile" not in sim_kwargs:
            sim_kwargs["profile"] = pool.load_profile()  # its worker types' models, its workload
        self.sim = Simulator(pool.slot_cluster(), workload, scenario, **sim_kwargs)
        fitted = fitted_lr_response() if lr_tolerance is None or lr_exponent is None else (None, None)
        self.lr_tolerance = check_range(
            "lr_tolerance", fitted[0] if lr_tolerance is None else lr_tolerance, 1e-3, 10.0
        )
        self.lr_exponent = check_range(
            "lr_exponent", fitted[1] if lr_exponent is None else lr_exponent, 0.0, 2.0
        )
        self._reset_done = False

    @property
    def num_slots(self) -> int:
        return self.sim.num_workers

    # --- lifecycle -----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """A fresh run holding the pool's initial allocation. Spot preemptions draw from their own
        child stream of ``rng`` (else ``seed``)."""
        if rng is None:
            rng = np.random.default_rng(seed)
        pre_rng, sim_rng = rng.spawn(2)
        self.sim.reset(rng=sim_rng)
        self._rng = pre_rng
        self.lr_multiplier = 1.0
        self.sim.progress_scale = lr_progress_gain(1.0, self.lr_tolerance, self.lr_exponent)
        held = initial_held(self.pool)
        self._open_ledger(held)
        # The first group forms at t = 0 without a restart.
        self.sim.set_workers(held, 0.0)
        if self.pool.preemption.rate_per_hour > 0:
            for slot in np.flatnonzero(self.slot_spot):
                self.sim.start_process(self._preemptions(int(slot)))
        self._reset_done = True

    def close(self) -> None:
        self.sim.close()

    # --- what the job holds and spends ---------------------------------------------------------------
    @property
    def held(self) -> np.ndarray:
        return self.sim.held

    def now_s(self) -> float:
        return self.sim.now_s

    # --- decisions -----------------------------------------------------------------------------------
    def change(self, deltas) -> dict[str, list]:
        """Request (positive) or release (negative) ``deltas[k]`` GPUs of offer k, all at once.

        Raises:
            ValueError: a delta that is not an integer, a request beyond the GPUs free in the pool
                or a release beyond those held, or a result below one GPU in all (each naming the
                offer, the field and the allowed range).
        """
        self._require_reset()
        d = check_deltas(deltas, self.offers, self.held_counts(), self.free_counts(), self.capacity)
        mask = self.held
        now = self.sim.now_s
        added, removed = pick_slots(d, self.slot_offer, mask, self.available, self.noticed)
        for s in added:
            mask[s] = True
            self._held_since[s] = now
            self.log.append(PoolEvent(now, "request", int(s), self.offers[self.slot_offer[s]]))
        for s in removed:
            self._bill(s, now)
            mask[s] = False
            self.noticed[s] = False
            self.log.append(PoolEvent(now, "release", int(s), self.offers[self.slot_offer[s]]))
        if self.sim.set_workers(mask, self.pool.restart_s):
            self.restarts += 1
        return {"added": [int(s) for s in added], "removed": [int(s) for s in removed]}

    def set_lr_multiplier(self, multiplier: float) -> None:
        lo, hi = LR_RANGE
        m = check_range("lr_multiplier", multiplier, lo, hi)
        self.lr_multiplier = m
        self.sim.progress_scale = lr_progress_gain(m, self.lr_tolerance, self.lr_exponent)

    def run_interval(self, local_batches, iterations: int) -> IntervalReport:
        self._require_reset()
        return self.sim.run_interval(local_batches, iterations)

    def truth_for(self, held: np.ndarray, local_batches: np.ndarray, progress: float | None = None) -> dict:
        """Ground truth for oracles: the noise-free iteration time (s) and progress per second of
        holding ``held`` at ``local_batches`` under the current faults (a restart not counted)."""
        sim = self.sim
        held = np.asarray(held, dtype=bool) & self.available
        if not held.any():
            return {"iteration_time_s": math.inf, "progress_per_s": 0.0, "global_batch": 0}
        b = np.asarray(local_batches, dtype=np.float64)
        st = sim.state
        comp = sim.compute_time_s(b)[held]
        r = int(held.sum())
        comm = sim._comm(r, len(np.unique(sim.node_of_worker[held])))
        sync = comm.sync_time_s(st.bandwidth_factor, sim.scenario.network.latency_jitter_s) if r > 1 else 0.0
        it = float(comm.iteration_time_s(comp.max(), sync))
        gb = int(b[held].sum())
        p, q = (sim.progress, sim.noise_progress) if progress is None else (progress, None)
        rate = sim.convergence.progress_per_step(gb, p, q) * sim.progress_scale / it
        return {"iteration_time_s": it, "progress_per_s": rate, "global_batch": gb}

    # --- internals -----------------------------------------------------------------------------------
    def _require_reset(self) -> None:
        if not self._reset_done:
            raise RuntimeError("ElasticJob.reset() must be called first")

    def _preemptions(self, slot: int) -> Iterator:
        spec = self.pool.preemption
        env = self.sim.clock
        offer = self.offers[self.slot_offer[slot]]
        while True:
            yield env.timeout(float(self._rng.exponential(3600.0 / spec.rate_per_hour)))
            lo, hi = spec.unavailable_s
            away = lo if lo == hi else float(self._rng.uniform(lo, hi))
            if not self.sim.state.held[slot] or not self.available[slot]:
                continue
            self.noticed[slot] = True
            self.log.append(PoolEvent(env.now, "notice", slot, offer))
            yield env.timeout(spec.notice_s)
            self.noticed[slot] = False
            self.available[slot] = False
            state = self.sim.state
            if state.held[slot]:  # not released during the notice
                self._bill(slot, env.now)
                mask = state.held.copy()
                mask[slot] = False
                self.log.append(PoolEvent(env.now, "preempt", slot, offer))
                if not mask.any():
                    # The job never runs on zero GPUs: the cheapest free on-demand GPU replaces it.
                    mask[self._replacement(mask, env.now)] = True
                state.set_held(mask)
                state.pending_delay_s += self.pool.restart_s
                self.restarts += 1
            yield env.timeout(away)
            self.available[slot] = True
            self.log.append(PoolEvent(env.now, "available", slot, offer))
