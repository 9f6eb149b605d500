"""The hindsight limit: the fastest schedule found with the seed's whole future in view.

Simulation only. A seed's fault history does not depend on the batches a controller picks (the
simulator draws faults and per-interval noise from separate child streams of the seed), so a
schedule can be tried again and again against the very same run: the planner searches schedules
by replaying the episode and keeps the one that reaches the target soonest. It is the yardstick
every controller's time to accuracy is read against (``TTA / limit``), not a controller one could
deploy.

Search space (all candidates read the simulator's true models through ``info["ground_truth"]``
and its hidden state through ``report.truth``, as the greedy oracle does):

* every static local batch on a power-of-two grid within the workers' ranges, starting from the
  backend's initial batch like every adaptive controller, and again (after the search, outside its
  budget) starting at the batch itself as the benchmark's static grid does (so the limit is never
  behind the best static batch);
* the greedy goodput oracle (:class:`~dynamix_gym.controllers.oracle.OracleController`) over a grid of
  its ``batch_penalty`` and ``min_gain`` (so the limit is never behind the teacher), and its
  time-to-target form (``objective="time_to_target"``) over the ``min_gain`` grid, after the search
  and outside its budget like the own-start statics;
* :class:`ScheduleController`: a global batch that follows a piecewise-linear schedule of
  ``log2 M`` over training progress, split every interval so that the workers' true compute times
  are equal, with hysteresis against reconfiguration pauses. Its knots are searched by the
  cross-entropy method (Rubinstein's CEM: sample, keep the elites, refit a Gaussian), started from
  the best candidate above, then the hysteresis is refined around the best knots.

Each candidate is scored by replaying the seed: its time to accuracy, or, if it misses the target,
the time budget times ``1 + `` the accuracy it lacked (so misses rank below every success and
among themselves by how close they came). The best candidate's description and score are cached
as JSON (``cache_dir``), keyed by a hash of the task, the seed and the planner's settings; a cached
plan is replayed without searching again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController, start_options
from dynamix_gym.controllers.oracle import OracleController, ground_truth
from dynamix_gym.controllers.split import equal_time_split, round_to_total
from dynamix_gym.controllers.static import StaticController
from sim.datafiles import atomic_write_text
from sim.protocol import BackendSpec

log = logging.getLogger(__name__)

#: Bump when the search changes, so that cached plans of an older planner are not reused.
PLANNER_VERSION = 1
#: Progress fractions (of the reference run's progress at the target) of the schedule's knots.
KNOT_FRACTIONS: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: Local batches tabulated per worker for the equal-time split.
_SPLIT_GRID_POINTS = 96


class ScheduleController(BaseController):
    """A global-batch schedule over training progress, split by equal true compute time.

    Every interval, with p the true progress (``truth["progress"]``) and P ``progress_scale``:

        log2 M*(p) = interp(p / P, KNOT_FRACTIONS, knots_log2)       # held beyond the last knot
        M*         = clip(2 ** log2 M*, sum of live minima, sum of live caps)
        b(M)       = split of M with equal true compute times (water-filling)

    The batches in force are replaced by ``b(M*)`` only if the global batch in force is off the
    schedule by more than ``tol_log2`` (in log2 units), or if re-splitting it would cut the true
    iteration time by more than ``min_gain`` (relative): each change costs the backend a
    reconfiguration pause.

    Args:
        knots_log2: log2 of the global batch at each of :data:`KNOT_FRACTIONS`.
        progress_scale: P, the progress the fractions are relative to (> 0, base-batch steps).
        tol_log2: schedule deviation tolerated without a change (>= 0).
        min_gain: relative iteration-time gain that justifies a re-split, in [0, 1).
    """

    name: ClassVar[str] = "schedule"
    uses_truth: ClassVar[bool] = True

    def __init__(
        self,
        knots_log2: list[float],
        progress_scale: float,
        tol_log2: float = 0.25,
        min_gain: float = 0.03,
    ) -> None:
        knots = np.asarray(knots_log2, dtype=np.float64)
        if knots.shape != (len(KNOT_FRACTIONS),) or not np.all(np.isfinite(knots)):
            raise ValueError(
                f"ScheduleController.knots_log2 must be {len(KNOT_FRACTIONS)} finite numbers, got {knots_log2!r}"
            )
        if not (math.isfinite(progress_scale) and progress_scale > 0):
            raise ValueError(f"ScheduleController.progress_scale must be > 0, got {progress_scale!r}")
        if not (math.isfinite(tol_log2) and tol_log2 >= 0):
            raise ValueError(f"ScheduleController.tol_log2 must be >= 0, got {tol_log2!r}")
        if not 0.0 <= min_gain < 1.0:
            raise ValueError(f"ScheduleController.min_gain must be in [0, 1), got {min_gain!r}")
        self.knots_log2 = knots
        self.progress_scale = float(progress_scale)
        self.tol_log2 = float(tol_log2)
        self.min_gain = float(min_gain)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        lo, hi = int(spec.min_batch.min()), int(spec.max_batch.max())
        self._grid = np.unique(np.rint(np.geomspace(lo, hi, _SPLIT_GRID_POINTS)))

    def target_global_batch(self, progress: float) -> float:
        x = progress / self.progress_scale
        return float(2.0 ** np.interp(x, KNOT_FRACTIONS, self.knots_log2))

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        truth, model = ground_truth(info, "ScheduleController")
        current = np.asarray(info["local_batches"], dtype=np.int64)
        alive = np.asarray(truth["alive"], dtype=bool)
        if not alive.any():
            return current.astype(np.float32), None
        lo, hi = self.spec.min_batch[alive], self.spec.max_batch[alive]
        m = int(np.clip(round(self.target_global_batch(truth["progress"])), lo.sum(), hi.sum()))
        m_now = int(current[alive].sum())
        off_schedule = abs(math.log2(m / m_now)) > self.tol_log2
        # Re-split at the scheduled batch if off schedule, else at the batch in force.
        total = m if off_schedule else m_now
        table = model.compute_time_s(np.repeat(self._grid[:, None], self.spec.num_workers, axis=1))
        split, _ = equal_time_split(self._grid, table[:, alive], np.array([total]), lo, hi)
        cand = current.copy()
        cand[alive] = round_to_total(split[0], total, lo, hi)
        if off_schedule:
            return cand.astype(np.float32), None
        t_now = model.iteration_time_s(current)
        t_new = model.iteration_time_s(cand)
        if t_new < t_now * (1.0 - self.min_gain):
            return cand.astype(np.float32), None
        return current.astype(np.float32), None


class PenaltyScheduleOracle(OracleController):
    """The greedy goodput oracle with its large-batch penalty scheduled over training progress.

    ``batch_penalty`` at true progress p is ``interp(p / P, KNOT_FRACTIONS, penalty_knots)``, so the
    trade-off between speed and the progress a large batch needs on top can differ between the
    early, middle and late phases of training (large early and small late, DYNAMIX's pattern, is one
    such schedule). Everything else is :class:`~dynamix_gym.controllers.oracle.OracleController`.

    Args:
        penalty_knots: the penalty at each of :data:`KNOT_FRACTIONS`, each in [0, 2].
        progress_scale: P (> 0, base-batch steps).
        min_gain: as the oracle's.
        grid_points: as the oracle's.
    """

    name: ClassVar[str] = "penalty_schedule"

    def __init__(
        self, penalty_knots: list[float], progress_scale: float, min_gain: float = 0.02, grid_points: int = 24
    ) -> None:
        super().__init__(grid_points=grid_points, min_gain=min_gain, batch_penalty=0.0)
        knots = np.asarray(penalty_knots, dtype=np.float64)
        if knots.shape != (len(KNOT_FRACTIONS),) or not np.all((knots >= 0) & (knots <= 2)):
            raise ValueError(
                f"PenaltyScheduleOracle.penalty_knots must be {len(KNOT_FRACTIONS)} numbers in [0, 2], "
                f"got {penalty_knots!r}"
            )
        if not (math.isfinite(progress_scale) and progress_scale > 0):
            raise ValueError(f"PenaltyScheduleOracle.progress_scale must be > 0, got {progress_scale!r}")
        self.penalty_knots = knots
        self.progress_scale = float(progress_scale)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        progress = ground_truth(info, "PenaltyScheduleOracle")[0]["progress"]
        self.batch_penalty = float(
            np.interp(progress / self.progress_scale, KNOT_FRACTIONS, self.penalty_knots)
        )
        return super().predict(observation, info, deterministic)


def make_candidate(desc: dict[str, Any]) -> BaseController:
    """The controller a plan description names (``{"kind": ..., **params}``)."""
    params = {k: v for k, v in desc.items() if k != "kind"}
    kinds = {
        "static": StaticController,
        "oracle": OracleController,
        "schedule": ScheduleController,
        "penalty_schedule": PenaltyScheduleOracle,
    }
    try:
        cls = kinds[desc["kind"]]
    except KeyError:
        raise ValueError(
            f"unknown hindsight candidate kind {desc.get('kind')!r}; known: {sorted(kinds)}"
        ) from None
    return cls(**params)


def replay(env: Any, controller: BaseController, seed: int) -> dict[str, Any]:
    """Runs ``controller`` for one episode of ``env`` from ``reset(seed)``; returns its score and
    the (true progress, global batch) path it took."""
    base = env.unwrapped
    spec = base.backend.spec
    obs, info = env.reset(seed=seed, options=start_options(controller, spec))
    controller.reset(spec, np.random.default_rng(seed))
    path: list[tuple[float, float]] = []
    terminated = truncated = False
    while not (terminated or truncated):
        action, _ = controller.predict(obs, info, deterministic=True)
        obs, _, terminated, truncated, info = env.step(action)
        report = info["report"]
        path.append((float(report.truth["progress"]), float(report.global_batch)))
    report = info["report"]
    reached = bool(terminated)
    if reached:
        score = float(report.wall_time_s)
    else:  # a miss ranks below every success, and by how much accuracy it lacked
        lacking = max(0.0, spec.target_accuracy - float(report.truth["val_accuracy"]))
        score = max(float(report.wall_time_s), spec.time_budget_s) * (1.0 + lacking)
    return {
        "score": score,
        "reached": reached,
        "time_s": float(report.wall_time_s),
        "path": path,
        "worker_decisions": len(path) * spec.num_workers,
    }


class HindsightController(BaseController):
    """The hindsight limit (see the module docstring): search, then replay the best plan.

    The search runs in :meth:`prepare`, which :func:`dynamix_gym.evaluation.run_episode` calls with
    the env and seed before the scored episode; the scored episode then follows the best plan, so
    its time to accuracy is the plan's (the simulator is deterministic per seed).

    Args:
        budget: the search's size in worker-decisions (replayed decisions times workers, > 0): a
            count, so that the same task and seed give the same plan on any machine. The pool of
            static and oracle candidates may use 30% of it, the batch schedules up to 65%, the
            penalty schedules up to 95%, the hysteresis refinement the rest.
        time_limit_s: a wall-clock safety cap (seconds, > 0); a search it cuts short is marked
            ``truncated_by_time`` in its record (and is then not reproducible).
        cem_iterations: CEM rounds over the schedule's knots (>= 0).
        cem_population: schedules sampled per round (>= 2).
        cem_elites: schedules kept per round to refit the sampling distribution (1 .. population).
        cem_init_sd: initial standard deviation of every knot (log2 units, > 0).
        penalties: the greedy oracle's ``batch_penalty`` values tried.
        oracle_min_gains: the greedy oracle's ``min_gain`` values tried.
        tolerances: schedule hysteresis ``tol_log2`` values tried around the best knots.
        cache_dir: where plans are cached (JSON, one file per task and seed); ``None``: no cache.
        plan: a plan description to replay instead of searching (as found in a cache file).
    """

    name: ClassVar[str] = "hindsight"
    uses_truth: ClassVar[bool] = True

    def __init__(
        self,
        budget: int = 400_000,
        time_limit_s: float = 600.0,
        cem_iterations: int = 6,
        cem_population: int = 10,
        cem_elites: int = 3,
        cem_init_sd: float = 0.75,
        penalties: tuple[float, ...] = (0.0, 0.1, 0.3, 0.6),
        oracle_min_gains: tuple[float, ...] = (0.02, 0.0),
        tolerances: tuple[float, ...] = (0.1, 0.25, 0.5),
        cache_dir: str | Path | None = None,
        plan: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(budget, bool) or int(budget) != budget or budget < 1:
            raise ValueError(
                f"HindsightController.budget must be an integer >= 1 (worker-decisions), got {budget!r}"
            )
        if not (math.isfinite(time_limit_s) and time_limit_s > 0):
            raise ValueError(f"HindsightController.time_limit_s must be > 0, got {time_limit_s!r}")
        for field, value, low in (
            ("cem_iterations", cem_iterations, 0),
            ("cem_population", cem_population, 2),
        ):
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(f"HindsightController.{field} must be an integer >= {low}, got {value!r}")
        if (
            isinstance(cem_elites, bool)
            or int(cem_elites) != cem_elites
            or not 1 <= cem_elites <= cem_population
        ):
            raise ValueError(
                f"HindsightController.cem_elites must be an integer in [1, cem_population={cem_population}], "
                f"got {cem_elites!r}"
            )
        if not (math.isfinite(cem_init_sd) and cem_init_sd > 0):
            raise ValueError(f"HindsightController.cem_init_sd must be > 0, got {cem_init_sd!r}")
        self.budget = int(budget)
        self.time_limit_s = float(time_limit_s)
        self.cem_iterations = int(cem_iterations)
        self.cem_population = int(cem_population)
        self.cem_elites = int(cem_elites)
        self.cem_init_sd = float(cem_init_sd)
        self.penalties = [float(p) for p in penalties]
        self.oracle_min_gains = [float(g) for g in oracle_min_gains]
        self.tolerances = [float(t) for t in tolerances]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.plan = dict(plan) if plan is not None else None
        self.search_log: dict[str, Any] | None = None
        self._inner: BaseController | None = None

    # --- the search --------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {
            "version": PLANNER_VERSION,
            "budget": self.budget,
            "time_limit_s": self.time_limit_s,
            "cem": [self.cem_iterations, self.cem_population, self.cem_elites, self.cem_init_sd],
            "penalties": list(self.penalties),
            "oracle_min_gains": list(self.oracle_min_gains),
            "tolerances": list(self.tolerances),
        }

    def cache_key(self, env: Any, seed: int) -> str:
        """A hash of what the plan depends on: the task (cluster, workload, scenario, interval,
        budgets), the seed and the planner's settings (not the time limit: a plan is a plan)."""
        base = env.unwrapped
        backend = base.backend
        sim = getattr(backend, "sim", None)
        parts = {
            # ``lr_rule`` is the simulator's (below, with its convergence model) and ``compute_curve_s``
            # is its compute model's (below); left out here so that plans cached before the spec carried
            # them keep their keys.
            "spec": {
                k: (v.tolist() if isinstance(v, np.ndarray) else v)
                for k, v in vars(backend.spec).items()
                if k not in ("lr_rule", "compute_curve_s")
            },
            "interval": base.interval,
            "max_decisions": base.max_decisions,
            "time_budget_s": base.time_budget_s,
            "sim": repr(
                (
                    sim.cluster,
                    sim.workload,
                    sim.scenario,
                    sim.reconfig_delay_s,
                    sim.interval_overhead_s,
                    sim.convergence.params,
                    sim.convergence.lr_rule,
                    *(a.tolist() for a in (sim._alpha, sim._beta, sim._exponent, sim._host, sim._k)),
                    # Only when present, so that plans cached before they existed keep their keys.
                    *([extras] if (extras := sim.convergence.params.model_extras()) else []),
                    *([compute] if (compute := sim.compute_extras()) else []),
                )
            )
            if sim is not None
            else None,
            "seed": int(seed),
            "planner": {k: v for k, v in self.settings().items() if k != "time_limit_s"},
        }
        blob = json.dumps(parts, sort_keys=True, default=repr).encode()
        return hashlib.sha256(blob).hexdigest()[:20]

    def prepare(self, env: Any, seed: int) -> None:
        """Finds (or loads) the best plan for ``env`` at ``seed``."""
        if self.plan is not None:
            self._inner = make_candidate(self.plan)
            return
        key = self.cache_key(env, seed)
        cached = self.cache_dir / f"{key}.json" if self.cache_dir is not None else None
        record = json.loads(cached.read_text()) if cached is not None and cached.exists() else None
        fresh = record is None
        if fresh:
            record = self.search(env, seed)
            record["key"] = key
        if self._own_start_statics(env, seed, record):  # new candidates since it was cached
            fresh = True
        if self._time_to_target_oracles(env, seed, record):
            fresh = True
        self.search_log = record
        self._inner = make_candidate(record["plan"])
        if cached is not None and fresh:
            atomic_write_text(cached, json.dumps(record, indent=1, sort_keys=True) + "\n")

    def _own_start_statics(self, env: Any, seed: int, record: dict[str, Any]) -> bool:
        """Static batches that run their warm-up interval at the batch too (as the benchmark's
        static grid does), tried after the search and outside its budget, so that a cached search
        and a fresh one give the same plan: every power of two whose per-worker clipping differs
        from the next smaller one's, up to the one that puts every worker at its memory cap. The
        better of them and the search's best is the plan. Returns whether any was new."""
        spec = env.unwrapped.backend.spec
        candidates: dict[str, dict[str, Any]] = {}
        previous = None
        for b in (2**k for k in range(21)):
            clipped = np.clip(b, spec.min_batch, spec.max_batch).tolist()
            if clipped != previous:
                candidates[str(b)] = {"kind": "static", "batch": b, "start_at_batch": True}
            previous = clipped
        return self._after_search(env, seed, record, "own_start_statics", "static_own_start", candidates)

    def _time_to_target_oracles(self, env: Any, seed: int, record: dict[str, Any]) -> bool:
        """The time-to-target oracle (:class:`OracleController` with ``objective="time_to_target"``)
        at every ``oracle_min_gains`` value, tried after the search and outside its budget like
        :meth:`_own_start_statics` (so that plans cached before it existed gain it without a new
        search, and the limit is never behind it). Returns whether any was new."""
        candidates = {
            str(g): {"kind": "oracle", "objective": "time_to_target", "batch_penalty": 0.0, "min_gain": g}
            for g in self.oracle_min_gains
        }
        return self._after_search(
            env, seed, record, "time_to_target_oracles", "oracle_time_to_target", candidates
        )

    @staticmethod
    def _after_search(
        env: Any,
        seed: int,
        record: dict[str, Any],
        key: str,
        kind: str,
        candidates: dict[str, dict[str, Any]],
    ) -> bool:
        """Replays every candidate not yet scored in ``record[key]`` (by name), makes the best of
        them the plan where it beats the record's, and notes the kind's best score. Returns whether
        any was new."""
        scores = record.setdefault(key, {})
        added = False
        for name, desc in candidates.items():
            if name in scores:
                continue
            result = replay(env, make_candidate(desc), seed)
            scores[name] = result["score"]
            added = True
            if result["score"] < record["score"]:
                record.update(
                    plan=desc,
                    score=result["score"],
                    reached=result["reached"],
                    time_to_accuracy_s=result["time_s"] if result["reached"] else None,
                )
        record["best_by_kind"][kind] = min(scores.values(), default=math.inf)
        return added

    def search(self, env: Any, seed: int) -> dict[str, Any]:
        """Runs the search (module docstring) and returns the best plan with its score."""
        t0 = time.perf_counter()
        spec = env.unwrapped.backend.spec
        rng = np.random.default_rng([int(seed), 7919])
        tried: list[tuple[float, dict[str, Any], dict[str, Any]]] = []

        used = [0]
        truncated = [False]

        def over(share: float = 1.0) -> bool:
            if time.perf_counter() - t0 > self.time_limit_s:
                truncated[0] = True
                return True
            return used[0] >= share * self.budget

        def score(desc: dict[str, Any]) -> float:
            result = replay(env, make_candidate(desc), seed)
            used[0] += result["worker_decisions"]
            tried.append((result["score"], desc, result))
            return result["score"]

        def best(kind: str | None = None) -> tuple[float, dict[str, Any], dict[str, Any]]:
            return min((t for t in tried if kind is None or t[1]["kind"] == kind), key=lambda t: t[0])

        lo, hi = int(spec.min_batch.min()), int(spec.max_batch.max())
        pool = [{"kind": "static", "batch": 2**k} for k in range(20) if lo <= 2**k <= hi]
        pool += [
            {"kind": "oracle", "batch_penalty": p, "min_gain": g}
            for p in self.penalties
            for g in self.oracle_min_gains
        ]
        for desc in pool:
            if over(0.3) and tried:
                break
            score(desc)
        # Progress scale and starting points from the best run so far.
        path = np.asarray(best()[2]["path"], dtype=np.float64)
        scale = float(max(path[-1, 0], 1e-6))
        order = np.argsort(path[:, 0], kind="stable")
        fractions = np.asarray(KNOT_FRACTIONS)
        knots = np.interp(fractions * scale, path[order, 0], np.log2(np.maximum(path[order, 1], 1.0)))
        m_lo, m_hi = math.log2(spec.min_batch.sum()), math.log2(spec.max_batch.sum())

        def schedule(k: np.ndarray, tol_log2: float = 0.25) -> dict[str, Any]:
            return {
                "kind": "schedule",
                "knots_log2": [round(float(v), 4) for v in k],
                "progress_scale": scale,
                "tol_log2": tol_log2,
                "min_gain": 0.03,
            }

        def penalty_schedule(k: np.ndarray) -> dict[str, Any]:
            return {
                "kind": "penalty_schedule",
                "penalty_knots": [round(float(v), 4) for v in k],
                "progress_scale": scale,
                "min_gain": 0.02,
            }

        best_oracle = (
            best("oracle")[1]["batch_penalty"] if any(t[1]["kind"] == "oracle" for t in tried) else 0.1
        )
        families = [
            (schedule, np.clip(knots, m_lo, m_hi), self.cem_init_sd, (m_lo, m_hi), 0.65),
            (penalty_schedule, np.full(fractions.shape, best_oracle), 0.3, (0.0, 2.0), 0.95),
        ]
        for make, mean, sd0, (b_lo, b_hi), share in families:
            self._cem(make, mean, sd0, b_lo, b_hi, score, rng, lambda share=share: over(share))
        if any(t[1]["kind"] == "schedule" for t in tried):
            best_knots = np.asarray(best("schedule")[1]["knots_log2"])
            for tol_log2 in self.tolerances:
                if over():
                    break
                if tol_log2 != 0.25:
                    score(schedule(best_knots, tol_log2))
        best_score, best_desc, best_result = best()
        by_kind: dict[str, float] = {}
        for s, desc, _ in tried:
            by_kind[desc["kind"]] = min(by_kind.get(desc["kind"], math.inf), s)
        return {
            "plan": best_desc,
            "score": best_score,
            "reached": best_result["reached"],
            "time_to_accuracy_s": best_result["time_s"] if best_result["reached"] else None,
            "candidates": len(tried),
            "worker_decisions": used[0],
            "truncated_by_time": truncated[0],
            "search_s": round(time.perf_counter() - t0, 2),
            "best_by_kind": by_kind,
            "settings": self.settings(),
        }

    def _cem(self, make, mean, sd0, low, high, score, rng, over) -> None:
        """Cross-entropy search over a knot vector: sample around ``mean``, refit to the elites (the
        best vector so far always among them), until the rounds or the time share run out."""
        mean = np.clip(np.asarray(mean, dtype=np.float64), low, high)
        sd = np.full(mean.shape, float(sd0))
        if over():
            return
        champion = (score(make(mean)), mean)
        for _ in range(self.cem_iterations):
            scored = []
            for _ in range(self.cem_population):
                if over():
                    break
                k = np.clip(mean + sd * rng.standard_normal(mean.shape), low, high)
                scored.append((score(make(k)), k))
            if len(scored) < self.cem_elites:
                return
            scored.sort(key=lambda t: t[0])
            if scored[0][0] < champion[0]:
                champion = scored[0]
            elites = np.stack([k for _, k in scored[: self.cem_elites]] + [champion[1]])
            mean = elites.mean(axis=0)
            sd = np.maximum(elites.std(axis=0), 0.05 * (high - low) / 4)

    # --- the scored episode ------------------------------------------------------------------------
    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        if self._inner is None:
            raise RuntimeError(
                "HindsightController.prepare(env, seed) must run before the episode (run_episode does "
                "it): the limit is searched against the episode it is scored on"
            )
        self._inner.reset(spec, rng)

    def initial_batches(self, spec: BackendSpec) -> np.ndarray | None:
        pick = getattr(self._inner, "initial_batches", None)
        return pick(spec) if pick is not None else None

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        return self._inner.predict(observation, info, deterministic)
