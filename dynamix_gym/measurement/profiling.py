"""Profiling a training backend for calibration (step times over a batch ladder, per-interval
overheads, static-batch training curves) and comparing a calibrated simulator with it (predicted
iteration times, time-to-accuracy tables, Kendall's tau of controller orderings, PPO's advantage).

Everything here drives a backend through the protocol only (``reset`` / ``run_interval`` /
``spec``), so the same code profiles the real DDP adapter or, in tests, the simulator itself. The
fitting is in :mod:`sim.profile` and :mod:`sim.fitting.hardware`; ``python -m experiments.calibrate``
glues the two.

Every loop runs against a wall-clock :class:`Budget` and shows a progress bar; a loop that runs out
of time stops early, keeps what it measured and says what it skipped.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dynamix_gym.stats import NoiseScaleEstimator, two_batch_estimates
from sim.protocol import Backend, IntervalReport
from sim.scaling import estimated_adascale_gain

log = logging.getLogger(__name__)


class Budget:
    """A wall-clock allowance: ``remaining_s()`` and ``allows(estimate_s)``."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not seconds > 0:
            raise ValueError(f"a profiling budget must be > 0 seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self._clock = clock
        self._start = clock()

    def elapsed_s(self) -> float:
        return self._clock() - self._start

    def remaining_s(self) -> float:
        return self.seconds - self.elapsed_s()

    def allows(self, estimate_s: float) -> bool:
        return estimate_s <= self.remaining_s()


# --------------------------------------------------------------------------------------------
# Step times over a batch ladder and worker counts
# --------------------------------------------------------------------------------------------


@dataclass
class LadderResult:
    """What :func:`profile_ladder` measured.

    ``points``: one dict per (workers, local batch) measured: ``workers``, ``gpu`` (the group's
    worker type), ``local_batch``, ``step_time_s`` (median over the repeats of the interval's mean
    iteration time), ``sync_time_s`` (median exposed all-reduce), ``compute_time_s`` (median per
    worker, a list), ``overhead_s`` (median of interval time - K x iteration time),
    ``first_overhead_s`` (that of the first, warm-up interval at the batch), ``step_cv`` (relative
    s.d. of the repeats' iteration times, times sqrt(K): the per-iteration spread if independent).
    ``intervals``: one dict per interval run (the raw data).
    """

    points: list[dict[str, Any]] = field(default_factory=list)
    intervals: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, int]] = field(default_factory=list)  # (workers, local batch)
    stopped_early: bool = False
    elapsed_s: float = 0.0
    budget_s: float = math.inf

    def message(self) -> str:
        done = f"{len(self.points)} ladder points in {self.elapsed_s:.0f} s of a {self.budget_s:.0f} s budget"
        if not self.stopped_early:
            return done
        top = max((p["local_batch"] for p in self.points), default=None)
        skipped = ", ".join(f"{w}x{b}" for w, b in self.skipped)
        return (
            f"{done}: OUT OF TIME, the ladder stopped early (largest batch measured: {top}); "
            f"skipped (workers x local batch): {skipped}"
        )


def _interval_row(report: IntervalReport, workers: int, batch: int, repeat: int) -> dict[str, Any]:
    alive = report.alive
    it = float(np.mean(report.iteration_time_s[alive]))
    return {
        "workers": workers,
        "local_batch": batch,
        "repeat": repeat,
        "iterations": int(report.iterations),
        "iteration_time_s": it,
        "comm_time_s": float(report.comm_time_s),
        "interval_time_s": float(report.interval_time_s),
        "overhead_s": float(report.interval_time_s) - report.iterations * it,
        **{f"w{i}_compute_time_s": float(c) for i, c in enumerate(report.compute_time_s)},
    }


def profile_ladder(
    backends: Mapping[int, Backend],
    batches: Sequence[int],
    *,
    iterations: int = 20,
    repeats: int = 3,
    warmup_iterations: int = 5,
    budget_s: float = 600.0,
    seed: int = 0,
    progress: bool = True,
) -> LadderResult:
    """Step times of every backend (keyed by its number of workers) at every local batch.

    Batches are measured in ascending order, each on every backend in turn, so that when the
    budget runs out it is the top of the ladder that is missing, for every worker count alike.
    At each point: one warm-up interval of ``warmup_iterations`` (its overhead is the cost of a
    batch change), then ``repeats`` intervals of ``iterations``, every worker at the same batch.
    A point is started only if the time it is expected to take (the previous point of the same
    backend, scaled by the batch ratio) fits in what is left of the budget.

    Args:
        backends: workers -> a backend of that many workers, all of one worker type.
        batches: the local-batch ladder (clipped to nothing: every batch must be in every
            worker's range).
    """
    if not backends:
        raise ValueError("profile_ladder needs at least one backend")
    ladder = sorted({int(b) for b in batches})
    for w, be in backends.items():
        spec = be.spec
        if spec.num_workers != w:
            raise ValueError(f"backends[{w}] has {spec.num_workers} workers")
        if len(set(spec.gpu_types)) != 1:
            raise ValueError(
                f"profile_ladder groups must be of one worker type, backends[{w}] has {sorted(set(spec.gpu_types))}"
            )
        bad = [b for b in ladder if np.any(b < spec.min_batch) or np.any(b > spec.max_batch)]
        if bad:
            raise ValueError(
                f"ladder batches {bad} are outside the range [{int(spec.min_batch.max())}, "
                f"{int(spec.max_batch.min())}] of backends[{w}]"
            )
    budget = Budget(budget_s)
    result = LadderResult(budget_s=budget_s)
    for be in backends.values():
        be.reset(seed=seed)
    last: dict[int, tuple[int, float]] = {}
    todo = [(b, w) for b in ladder for w in sorted(backends)]
    bar = tqdm(total=len(todo), desc="profiling step times", unit="point", disable=not progress)
    for i, (b, w) in enumerate(todo):
        prev = last.get(w)
        estimate = 0.0 if prev is None else prev[1] * max(1.0, b / prev[0])
        if result.stopped_early or not budget.allows(estimate):
            result.stopped_early = True
            result.skipped = [(ww, bb) for bb, ww in todo[i:]]
            break
        t0 = time.monotonic()
        be = backends[w]
        gpu = be.spec.gpu_types[0]
        batches_w = np.full(w, b, dtype=np.int64)
        warm = be.run_interval(batches_w, warmup_iterations)
        first = _interval_row(warm, w, b, -1)
        result.intervals.append(first)
        rows = []
        for r in range(repeats):
            row = _interval_row(be.run_interval(batches_w, iterations), w, b, r)
            rows.append(row)
            result.intervals.append(row)
        steps = np.array([r["iteration_time_s"] for r in rows])
        compute = [float(np.median([r[f"w{k}_compute_time_s"] for r in rows])) for k in range(w)]
        result.points.append(
            {
                "workers": w,
                "gpu": gpu,
                "local_batch": b,
                "step_time_s": float(np.median(steps)),
                "sync_time_s": float(np.median([r["comm_time_s"] for r in rows])),
                "compute_time_s": compute,
                "overhead_s": float(np.median([r["overhead_s"] for r in rows])),
                "first_overhead_s": first["overhead_s"],
                "step_cv": float(np.std(steps) / np.mean(steps) * math.sqrt(iterations))
                if repeats > 1
                else math.nan,
            }
        )
        last[w] = (b, time.monotonic() - t0)
        bar.update(1)
        bar.set_postfix(workers=w, batch=b, left_s=f"{budget.remaining_s():.0f}")
    bar.close()
    result.elapsed_s = budget.elapsed_s()
    (log.warning if result.stopped_early else log.info)("%s", result.message())
    return result


def reference_rows(result: LadderResult, app: str, model: str) -> list[dict[str, Any]]:
    """The ladder as rows of the reference table format (``sim/data/reference``): one per
    (workers, local batch), one node, ``step_time_s`` the median iteration time and
    ``sync_time_s`` the median exposed all-reduce (0 for one worker, at most the step time)."""
    rows = []
    for p in sorted(result.points, key=lambda p: (p["workers"], p["local_batch"])):
        w = int(p["workers"])
        step = float(p["step_time_s"])
        sync = 0.0 if w == 1 else float(np.clip(p["sync_time_s"], 0.0, step))
        rows.append(
            {
                "gpu": p["gpu"],
                "app": app,
                "model": model,
                "placement": str(w),
                "num_nodes": 1,
                "num_gpus": w,
                "local_batch": int(p["local_batch"]),
                "step_time_s": step,
                "sync_time_s": sync,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# Per-interval overheads seen by an episode
# --------------------------------------------------------------------------------------------


@dataclass
class Overheads:
    """Wall time per decision interval beyond its iterations, as an episode pays it.

    ``interval_overhead_s``: median over steady intervals of (wall-clock advance - K x iteration
    time); ``reconfig_delay_s``: how much more an interval whose batches changed costs (median,
    floored at 0); ``samples``: the raw (changed, overhead) pairs.
    """

    interval_overhead_s: float
    reconfig_delay_s: float
    samples: list[tuple[bool, float]]


def measure_overheads(
    step: Callable[[np.ndarray], IntervalReport | None],
    schedule: Iterable[np.ndarray],
    *,
    progress: bool = True,
    budget_s: float = math.inf,
) -> Overheads:
    """Run ``step(batches)`` (one env step / interval) over ``schedule`` and split each interval's
    wall-clock advance into its iterations and the rest.

    The wall-clock advance is taken from consecutive reports' ``wall_time_s``, so whatever runs
    between two intervals (the env's encoding, a controller) counts as it does in an episode.
    ``step`` returns ``None`` to end the measurement early (its episode is over: the intervals left
    of ``schedule`` are not run).
    """
    budget = Budget(budget_s) if math.isfinite(budget_s) else None
    sched = [np.asarray(b, dtype=np.int64) for b in schedule]
    samples: list[tuple[bool, float]] = []
    prev_b: np.ndarray | None = None
    prev_wall: float | None = None
    for b in tqdm(sched, desc="measuring interval overheads", unit="interval", disable=not progress):
        if budget is not None and budget.remaining_s() <= 0:
            log.warning("overhead measurement out of time after %d intervals", len(samples))
            break
        report = step(b)
        if report is None:
            log.info("overhead measurement ended by its step after %d intervals", len(samples))
            break
        if prev_wall is not None:
            it = float(np.mean(report.iteration_time_s[report.alive]))
            over = float(report.wall_time_s) - prev_wall - report.iterations * it
            samples.append((prev_b is not None and bool(np.any(b != prev_b)), over))
        prev_b, prev_wall = b, float(report.wall_time_s)
    steady = [o for c, o in samples if not c]
    changed = [o for c, o in samples if c]
    if not steady:
        raise ValueError("the overhead schedule needs intervals whose batches did not change")
    base = float(np.median(steady))
    reconfig = max(0.0, float(np.median(changed)) - base) if changed else 0.0
    return Overheads(interval_overhead_s=max(base, 0.0), reconfig_delay_s=reconfig, samples=samples)


def overhead_schedule(
    batches: Sequence[int], intervals: int, change_every: int, workers: int
) -> list[np.ndarray]:
    """``intervals`` batch vectors, every rank at one of ``batches`` in turn, each held
    ``change_every`` intervals: steady intervals and changed ones for :func:`measure_overheads`."""
    return [
        np.full(workers, int(batches[(i // change_every) % len(batches)]), dtype=np.int64)
        for i in range(intervals)
    ]


def measure_env_overheads(
    env: Any, schedule: Iterable[np.ndarray], *, seed: int, progress: bool = True, budget_s: float = math.inf
) -> tuple[Overheads, bool]:
    """:func:`measure_overheads` through ``env`` (an absolute-mode env over the backend: its
    encoding counts as in an episode), from ``env.reset(seed=seed)``; the measurement stops when
    the episode ends (its target reached). Returns the overheads and whether the episode ended."""
    ended: list[bool] = []

    def step(batches: np.ndarray) -> IntervalReport | None:
        if ended:
            return None
        _, _, terminated, truncated, info = env.step(batches.astype(np.float32))
        if terminated or truncated:
            ended.append(True)
        return info["report"]

    env.reset(seed=seed)
    return measure_overheads(step, schedule, progress=progress, budget_s=budget_s), bool(ended)


# --------------------------------------------------------------------------------------------
# Static-batch training curves (for the convergence model)
# --------------------------------------------------------------------------------------------


@dataclass
class CurveRun:
    """One static-batch run, interval by interval (see :class:`sim.fitting.curves.Curve`)."""

    local_batch: int
    global_batch: int
    seed: int
    rows: list[dict[str, Any]]
    complete: bool  # reached the progress target (False: stopped by the budget)


def measure_curve(
    backend: Backend,
    local_batch: int,
    *,
    seed: int,
    iterations: int,
    progress_target: float,
    max_intervals: int = 10_000,
    noise_smoothing: float = 0.2,
    budget: Budget | None = None,
    bar: Any = None,
) -> CurveRun:
    """Train at ``local_batch`` on every worker from a fresh start until ``progress_target``
    base-batch steps (or the budget) and record every interval.

    Progress counts ``estimated_adascale_gain`` per step with the noise scale estimated from the reports
    exactly as the real backend's learning-rate rule does (an EMA of the two-batch estimates of
    the previous intervals, weight ``noise_smoothing``, leaving out the run's first intervals as its
    guards do). Each row records that EMA (``grad_sqr``, ``grad_var``, ``noise_scale``) and the
    interval's own two-batch estimates (``grad_sqr_raw``, ``grad_var_raw``: what the simulator's
    gradient statistics stand for, since an env smooths a simulated report exactly as it smooths a
    real one).
    """
    spec = backend.spec
    n = spec.num_workers
    batches = np.full(n, int(local_batch), dtype=np.int64)
    m0 = spec.base_batch
    est = NoiseScaleEstimator(noise_smoothing)
    # a real backend's rule leaves out its first intervals' estimates (sim.guards.GuardConfig.lr_gain_warmup)
    warmup = int(getattr(backend, "lr_noise_warmup", 0))
    backend.reset(seed=seed)
    rows: list[dict[str, Any]] = []
    steps, prog = 0, 0.0
    complete = False
    for _ in range(max_intervals):
        if budget is not None and budget.remaining_s() <= 0:
            break
        gain = estimated_adascale_gain(float(batches.sum()), m0, est.noise_scale)
        report = backend.run_interval(batches, iterations)
        raw = two_batch_estimates(report)
        if len(rows) >= warmup:
            est.update(report)
        alive = report.alive
        steps += iterations
        prog += iterations * gain
        g2 = est.grad_sqr if est.grad_sqr is not None else math.nan
        tr = est.trace_sigma if est.trace_sigma is not None else math.nan
        rows.append(
            {
                "steps": steps,
                "progress": prog,
                "wall_time_s": float(report.wall_time_s),
                "epoch": float(report.epoch),
                "val_accuracy": float(report.val_accuracy),
                "train_accuracy": float(np.mean(report.batch_accuracy[alive])),
                "grad_sqr": g2,
                "grad_var": tr / m0 if math.isfinite(tr) else math.nan,
                "noise_scale": est.noise_scale if est.noise_scale is not None else math.nan,
                "grad_sqr_raw": raw[0] if raw is not None else math.nan,
                "grad_var_raw": raw[1] / m0 if raw is not None else math.nan,
                "iteration_time_s": float(np.mean(report.iteration_time_s[alive])),
            }
        )
        if bar is not None:
            bar.update(min(prog, progress_target) - min(prog - iterations * gain, progress_target))
            bar.set_postfix(batch=int(local_batch), seed=seed, acc=f"{report.val_accuracy:.3f}")
        if prog >= progress_target:
            complete = True
            break
    return CurveRun(int(local_batch), int(batches.sum()), int(seed), rows, complete)


def measure_curves(
    backend: Backend,
    local_batches: Sequence[int],
    seeds: Sequence[int],
    *,
    iterations: int,
    progress_target: float,
    budget_s: float,
    noise_smoothing: float = 0.2,
    progress: bool = True,
) -> tuple[list[CurveRun], list[str]]:
    """:func:`measure_curve` for every (local batch, seed), within one budget.

    Returns the runs and notes (runs cut short or skipped by the budget)."""
    budget = Budget(budget_s)
    runs: list[CurveRun] = []
    notes: list[str] = []
    total = progress_target * len(local_batches) * len(seeds)
    bar = tqdm(total=total, desc="training curves (base-batch steps)", disable=not progress)
    for seed in seeds:
        for b in local_batches:
            if budget.remaining_s() <= 0:
                notes.append(f"out of time: no curve at local batch {b}, seed {seed}")
                continue
            run = measure_curve(
                backend,
                b,
                seed=seed,
                iterations=iterations,
                progress_target=progress_target,
                noise_smoothing=noise_smoothing,
                budget=budget,
                bar=bar,
            )
            if not run.complete:
                notes.append(
                    f"out of time: the curve at local batch {b}, seed {seed} stopped at progress "
                    f"{run.rows[-1]['progress'] if run.rows else 0:.0f} of {progress_target:.0f}"
                )
            runs.append(run)
    bar.close()
    for note in notes:
        log.warning("%s", note)
    return runs, notes


# --------------------------------------------------------------------------------------------
# Measuring on a shared machine
# --------------------------------------------------------------------------------------------


def wait_for_quiet(
    threshold: float = 0.8,
    hold_s: float = 60.0,
    poll_s: float = 10.0,
    max_wait_s: float = 2700.0,
    *,
    loadavg: Callable[[], tuple[float, float, float]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Wait until the 1-minute load average stays below ``threshold`` for ``hold_s`` seconds
    (timing measurements are distorted by other processes), at most ``max_wait_s``.

    Returns ``{"quiet": bool, "waited_s": float, "samples": [(t, load1), ...]}``; when the machine
    never gets quiet the caller measures anyway and reports the load it measured under.
    """
    read = loadavg or os.getloadavg
    start = clock()
    quiet_since: float | None = None
    samples: list[tuple[float, float]] = []
    while True:
        now = clock() - start
        load1 = float(read()[0])
        samples.append((round(now, 1), round(load1, 2)))
        if load1 < threshold:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= hold_s:
                return {"quiet": True, "waited_s": now, "samples": samples}
        else:
            quiet_since = None
        if now >= max_wait_s:
            log.warning(
                "the machine did not get quiet within %.0f s (load %.2f): measuring anyway", max_wait_s, load1
            )
            return {"quiet": False, "waited_s": now, "samples": samples}
        sleep(poll_s)


def quiet_wait(q: Any) -> dict[str, Any] | None:
    """:func:`wait_for_quiet` with a config's ``quiet`` settings (enabled, threshold, hold_s,
    poll_s, max_wait_s); None when not enabled."""
    if not q.enabled:
        return None
    return wait_for_quiet(float(q.threshold), float(q.hold_s), float(q.poll_s), float(q.max_wait_s))
