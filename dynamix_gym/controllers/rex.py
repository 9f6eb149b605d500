"""REX: a noise-scale-driven global batch, split across workers from fitted per-worker time curves."""

from __future__ import annotations

import logging
import warnings
from collections import deque
from typing import Any, ClassVar

import numpy as np
import scipy.optimize
import scipy.stats
from scipy.interpolate import PchipInterpolator
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Matern

from dynamix_gym.controllers.base import BaseController, memory_global_batch
from dynamix_gym.controllers.split import equal_time_split, fill_to_total, round_to_total
from dynamix_gym.controllers.threads import single_blas_thread
from dynamix_gym.stats import MAX_NOISE_SCALE, NoiseScaleEstimator, two_batch_estimates
from sim.protocol import BackendSpec
from sim.scaling import statistical_efficiency

log = logging.getLogger(__name__)

#: Local batches at which each worker's fitted time curve is tabulated.
_TABLE_POINTS = 160
#: Observations per (worker, local batch) whose median is the curve's point there.
_POINT_MEMORY = 3
#: A batch within this relative distance of a measured one counts as measured (trigger ratios).
_NEAR_MEASURED = 0.3
#: Fewest long-window ratios the trigger tests against (with two short ones, 5 is the fewest
#: for which a one-sided Mann-Whitney p-value can fall below 0.05: 1 / C(7, 2) = 0.048).
_MIN_LONG = 5
#: Random candidates scored by expected improvement per Bayesian-optimisation step.
_EI_CANDIDATES = 256


def _median(values: list[float]) -> float:
    """Median of a short list (numpy's is ~50x slower on three numbers)."""
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else 0.5 * (v[mid - 1] + v[mid])


class WorkerTimeModel:
    """One worker's compute time per iteration as a function of its local batch, fitted online.

    Points are the median of the last few measurements at each local batch. Inside the measured
    range the curve is a monotone cubic spline (scipy ``PchipInterpolator``) through the isotonic
    (non-decreasing, least-squares; scipy ``isotonic_regression``) fit of the points: compute
    time never falls as the batch grows, and a shape-preserving spline cannot overshoot between
    distant points. Outside the range the curve is continued pessimistically, never predicting a
    worker faster than measured:

        b < b_min:   T(b) = T(b_min)                  # a smaller batch is not assumed faster
        b > b_max:   T(b) = T(b_max) * b / b_max      # no fixed overhead assumed: time ~ batch
    """

    def __init__(self) -> None:
        self._obs: list[tuple[int, float, float]] = []  # (interval, local batch, compute time)
        self._cache: tuple[np.ndarray, np.ndarray, PchipInterpolator | None] | None = None

    def __len__(self) -> int:
        return len(self._obs)

    def add(self, step: int, batch: float, time_s: float) -> None:
        self._obs.append((step, float(batch), float(time_s)))
        self._cache = None

    def rescale(self, before_step: int, factor: float, drop_step: int | None = None) -> None:
        """Multiply every measurement taken before ``before_step`` by ``factor`` (a regime change);
        drop those of ``drop_step`` (an interval that straddled the change)."""
        self._obs = [(k, b, t * factor if k < before_step else t) for k, b, t in self._obs if k != drop_step]
        self._cache = None

    def before(self, step: int) -> WorkerTimeModel:
        """The curve fitted to the measurements taken before interval ``step`` only."""
        ref = WorkerTimeModel()
        ref._obs = [o for o in self._obs if o[0] < step]
        return ref

    def since(self, step: int) -> list[tuple[int, float, float]]:
        """Measurements (interval, local batch, compute time) from interval ``step`` on."""
        return [o for o in self._obs if o[0] >= step]

    def _fit(self) -> tuple[np.ndarray, np.ndarray, PchipInterpolator | None]:
        if self._cache is None:
            by_batch: dict[float, list[float]] = {}
            for _, b, t in self._obs:
                by_batch.setdefault(b, []).append(t)
            xs = np.array(sorted(by_batch))
            ys = np.array([_median(by_batch[b][-_POINT_MEMORY:]) for b in xs])
            curve = None
            if xs.size >= 2:
                ys = scipy.optimize.isotonic_regression(ys).x
                curve = PchipInterpolator(xs, ys, extrapolate=False)
            self._cache = (xs, ys, curve)
        return self._cache

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Measured local batches and the (isotonic) compute times the curve passes through."""
        xs, ys, _ = self._fit()
        return xs, ys

    def predict(self, batches: np.ndarray, extrapolate: str = "pessimistic") -> np.ndarray:
        """Predicted compute time (s) at ``batches``.

        Args:
            batches: local batches.
            extrapolate: ``"pessimistic"`` (the class docstring's rule, for planning) or
                ``"linear"`` (continue the secant of the two outermost points at each end, for
                judging whether a measurement fits the curve).
        """
        b = np.asarray(batches, dtype=np.float64)
        xs, ys, curve = self._fit()
        if xs.size == 0:
            raise ValueError("WorkerTimeModel.predict needs at least one measurement")
        inside = np.clip(b, xs[0], xs[-1])
        t = np.full(b.shape, ys[0]) if curve is None else curve(inside)
        if extrapolate == "linear" and xs.size >= 2:
            lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            t = np.where(b < xs[0], ys[0] + lo_slope * (b - xs[0]), t)
            t = np.where(b > xs[-1], ys[-1] + hi_slope * (b - xs[-1]), t)
        else:
            t = np.where(b > xs[-1], ys[-1] * b / xs[-1], t)
        return np.maximum(t, 1e-6)


class REXController(BaseController):
    """REX: noise-scale-driven global batch (AIMD with a Wilcoxon gate) and a fitted, balanced split.

    Source: the REX design of the project's issue 4 (we could not locate a published paper of
    that name in the reference corpus; every rule below is implemented as specified there).

    Global batch M (every interval):

    * each interval gives one raw two-batch noise-scale estimate B_k (McCandlish et al. 2018,
      :func:`~dynamix_gym.stats.two_batch_estimates`) and the EMA estimate B;
    * exponential increase: M_up = min(growth * M, max_global_batch) is adopted when a one-sided
      Wilcoxon signed-rank test (scipy.stats.wilcoxon) over the last ``test_window`` raw estimates
      confirms, at level ``alpha``, that the statistical efficiency at M_up stays above
      ``min_efficiency``:  d_k = E(M_up; B_k) - min_efficiency > 0,  E(M; B) = (B + M0) / (B + M);
    * multiplicative decrease: M <- max(decrease * M, min_global_batch) when the EMA efficiency
      E(M; B) falls below min_efficiency / 2 (half the increase bar, so the two never oscillate).

    Split of M across the live workers:

    * each worker's compute time versus local batch is a :class:`WorkerTimeModel` (monotone
      cubic splines through an isotonic fit, scipy.interpolate / scipy.optimize) of its
      measurements;
    * the split minimises the spread (max - min) of the predicted compute times at fixed M, found
      by Bayesian optimisation (scikit-learn GaussianProcessRegressor, Matern 5/2, expected
      improvement) over log-multipliers z in [-bo_width, bo_width]^N of a base split, seeded with
      that base (the equal-time water-filling split of the same curves) and ``bo_init`` random
      points, then ``bo_iterations`` EI steps; the GP's kernel hyper-parameters are fitted once
      per search and cached;
    * re-split only when M changed, the trigger fired, or the curves predict that the slowest
      worker would gain more than ``min_gain`` (relative): each change costs a reconfiguration.

    Trigger (two-level, per worker): each worker's curve is refitted to its measurements before
    the short window (the last ``short_window`` intervals); the ratios rho = measured / predicted
    compute time of the short window (out of sample) and of the ``long_window`` intervals before
    it (in sample, about 1) are compared, counting only batches within 30% of a measured one and
    continuing the curve linearly beyond its ends. A one-sided Mann-Whitney U test
    (scipy.stats.mannwhitneyu) at level ``alpha`` in either direction, with the short window's
    median ratio off both 1 and the long window's median by at least ``min_shift`` (relative),
    marks a persistent slowdown (or recovery): the worker's older measurements are rescaled by
    the newest ratio (the interval just before the short window, which may straddle the change,
    is dropped) and M is re-split at once, mid-epoch. Every firing is logged in
    ``self.triggers``.

    Args:
        initial_global_batch: M at the start; ``None`` is the backend's initial global batch.
        min_global_batch: floor of M; ``None`` is half the initial global batch.
        max_global_batch: ceiling of M (also capped by the workers' memory); ``None``:
            ``max_global_fraction`` of the memory capacity (below).
        max_global_fraction: the default ceiling's share of the memory capacity, in (0, 1]:
            max(round(f * sum_i max_batch_i), sum_i min_batch_i), a workload-relative rule
            tuned on the tuning seeds of CIFAR-10 and NCF (results/baselines/TUNING.md).
        growth: factor of an exponential increase (> 1).
        decrease: factor of a multiplicative decrease, in (0, 1).
        min_efficiency: efficiency bar of an increase, in (0, 1).
        test_window: raw noise-scale estimates in the Wilcoxon test (>= 5: with fewer, no
            one-sided p-value falls below 0.05).
        alpha: significance level of both tests, in (0, 0.5].
        short_window: intervals in the trigger's short window (>= 1).
        long_window: intervals in the trigger's long window (>= 2).
        min_shift: smallest relative change of the median ratio the trigger acts on, >= 0.
        bo_init: random seeds of a split search (>= 1).
        bo_iterations: EI steps of a split search (>= 0).
        bo_width: half-width of the log-multiplier search box, > 0.
        min_gain: predicted relative gain of the slowest worker that justifies a re-split, >= 0.
        noise_smoothing: EMA weight of the newest interval in the noise-scale estimate, (0, 1].
    """

    name: ClassVar[str] = "rex"

    def __init__(
        self,
        initial_global_batch: int | None = None,
        min_global_batch: int | None = None,
        max_global_batch: int | None = None,
        max_global_fraction: float = 0.25,
        growth: float = 2.0,
        decrease: float = 0.5,
        min_efficiency: float = 0.1,
        test_window: int = 6,
        alpha: float = 0.05,
        short_window: int = 2,
        long_window: int = 8,
        min_shift: float = 0.15,
        bo_init: int = 6,
        bo_iterations: int = 10,
        bo_width: float = 0.3,
        min_gain: float = 0.03,
        noise_smoothing: float = 0.2,
    ) -> None:
        for field, value in (
            ("initial_global_batch", initial_global_batch),
            ("min_global_batch", min_global_batch),
            ("max_global_batch", max_global_batch),
        ):
            if value is not None and (int(value) != value or value < 1):
                raise ValueError(f"REXController.{field} must be None or an integer >= 1, got {value!r}")
        checks = (
            ("max_global_fraction", max_global_fraction, 1e-9, 1.0),
            ("growth", growth, 1.0 + 1e-9, np.inf),
            ("decrease", decrease, 1e-9, 1.0 - 1e-9),
            ("min_efficiency", min_efficiency, 1e-9, 1.0 - 1e-9),
            ("test_window", test_window, 5, np.inf),
            ("alpha", alpha, 1e-9, 0.5),
            ("short_window", short_window, 1, np.inf),
            ("long_window", long_window, 2, np.inf),
            ("min_shift", min_shift, 0.0, np.inf),
            ("bo_init", bo_init, 1, np.inf),
            ("bo_iterations", bo_iterations, 0, np.inf),
            ("bo_width", bo_width, 1e-9, 5.0),
            ("min_gain", min_gain, 0.0, 1.0),
            ("noise_smoothing", noise_smoothing, 1e-9, 1.0),
        )
        for field, value, low, high in checks:
            if not low <= value <= high:
                raise ValueError(f"REXController.{field} must be in [{low:g}, {high:g}], got {value!r}")
        self.initial_global_batch = initial_global_batch
        self.min_global_batch = min_global_batch
        self.max_global_batch = None if max_global_batch is None else int(max_global_batch)
        self.max_global_fraction = float(max_global_fraction)
        self.growth = float(growth)
        self.decrease = float(decrease)
        self.min_efficiency = float(min_efficiency)
        self.test_window = int(test_window)
        self.alpha = float(alpha)
        self.short_window = int(short_window)
        self.long_window = int(long_window)
        self.min_shift = float(min_shift)
        self.bo_init = int(bo_init)
        self.bo_iterations = int(bo_iterations)
        self.bo_width = float(bo_width)
        self.min_gain = float(min_gain)
        self.noise_smoothing = float(noise_smoothing)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        n = spec.num_workers
        m0 = int(spec.initial_batch.sum())
        self.global_batch = int(self.initial_global_batch or m0)
        self._min_m = int(self.min_global_batch or max(1, m0 // 2))
        if self.max_global_batch is None:
            self._max_m = memory_global_batch(spec, self.max_global_fraction)
        else:
            self._max_m = self.check_global_batch("max_global_batch", self.max_global_batch)
        self.noise = NoiseScaleEstimator(self.noise_smoothing)
        self._raw_noise: deque[float] = deque(maxlen=self.test_window)
        self.models = [WorkerTimeModel() for _ in range(n)]
        self._grid = np.unique(
            np.rint(np.geomspace(spec.min_batch.min(), spec.max_batch.max(), _TABLE_POINTS))
        )
        self._kernel = None
        self._step = 0
        self.triggers: list[dict[str, Any]] = []  # each firing of the Mann-Whitney trigger
        self.batch_history: list[int] = []  # M after each decision
        self.bo_runs = 0

    # --- global batch --------------------------------------------------------------------------
    def _update_global_batch(self, report) -> bool:
        est = two_batch_estimates(report)
        if est is not None:
            g2, s = est
            raw = MAX_NOISE_SCALE if g2 <= s / MAX_NOISE_SCALE else max(s / g2, 1.0)
            self._raw_noise.append(raw)
        ema = self.noise.update(report)
        if ema is None:
            return False
        m, m0 = self.global_batch, self.spec.base_batch
        cap = int(self.spec.max_batch[report.alive].sum()) if report.alive.any() else m
        m_up = min(round(m * self.growth), self._max_m, cap)
        if m_up > m and len(self._raw_noise) == self.test_window:
            d = statistical_efficiency(np.array(self._raw_noise), m_up, m0) - self.min_efficiency
            if self._wilcoxon_greater(d):
                self.global_batch = m_up
                return True
        if statistical_efficiency(ema, m, m0) < 0.5 * self.min_efficiency:
            m_down = max(round(m * self.decrease), self._min_m)
            if m_down < m:
                self.global_batch = m_down
                return True
        return False

    def _wilcoxon_greater(self, d: np.ndarray) -> bool:
        if not np.any(d != 0):
            return False
        return bool(scipy.stats.wilcoxon(d, alternative="greater").pvalue < self.alpha)

    # --- trigger ---------------------------------------------------------------------------------
    def _trigger(self, i: int, wall_time_s: float) -> bool:
        """Two-level Mann-Whitney test of worker i's newest compute times against its curve."""
        model = self.models[i]
        first_short = self._step - self.short_window + 1
        # The reference: the curve fitted to everything before the short window. The long window's
        # ratios are in-sample (about 1), the short window's out-of-sample; only measurements
        # within 30% of a reference batch count (a long extrapolation is no evidence).
        ref = model.before(first_short)
        if len(ref) == 0:
            return False
        recent = np.array(model.since(first_short - self.long_window)).reshape(-1, 3)
        xs, _ = ref.points()
        steps, batches, times = recent.T
        near = np.min(np.abs(batches[:, None] - xs[None, :]), axis=1) <= _NEAR_MEASURED * batches
        ratio = times / ref.predict(batches, extrapolate="linear")
        short = ratio[near & (steps >= first_short)]
        long = ratio[near & (steps < first_short)]
        if short.size < self.short_window or long.size < _MIN_LONG:
            return False
        med_short, med_long = float(np.median(short)), float(np.median(long))
        # A regime change: the curve is off now (short vs 1) and was not before (short vs long).
        if abs(med_short / med_long - 1.0) < self.min_shift or abs(med_short - 1.0) < self.min_shift:
            return False
        side = "greater" if med_short > med_long else "less"
        if scipy.stats.mannwhitneyu(short, long, alternative=side).pvalue >= self.alpha:
            return False
        # The newest interval lies wholly in the new regime; the one before the short window may
        # straddle the change, so it is dropped.
        factor = float(short[-1])
        model.rescale(first_short, factor, drop_step=first_short - 1)
        self.triggers.append(
            {"step": self._step, "wall_time_s": wall_time_s, "worker": i, "direction": side, "factor": factor}
        )
        log.debug("REX trigger: worker %d %s by %.2fx at t=%.0fs", i, side, factor, wall_time_s)
        return True

    # --- split -----------------------------------------------------------------------------------
    def _table(self, workers: np.ndarray) -> np.ndarray:
        return np.stack([self.models[i].predict(self._grid) for i in workers], axis=1)

    def _times(self, table: np.ndarray, batches: np.ndarray) -> np.ndarray:
        return np.array([np.interp(b, self._grid, table[:, j]) for j, b in enumerate(batches)])

    def _bo_split(
        self, base: np.ndarray, m: int, lo: np.ndarray, hi: np.ndarray, table: np.ndarray
    ) -> np.ndarray:
        """Minimise the spread of predicted times over splits base * exp(z) (rescaled to M)."""
        self.bo_runs += 1
        n = base.size
        w = self.bo_width

        def realise(z: np.ndarray) -> np.ndarray:
            return round_to_total(fill_to_total(base * np.exp(z), m, lo, hi), m, lo, hi)

        def score(z: np.ndarray) -> tuple[float, float, np.ndarray]:
            b = realise(z)
            t = self._times(table, b)
            return float((t.max() - t.min()) / t.max()), float(t.max()), b

        zs = [np.zeros(n)] + [self.rng.uniform(-w, w, n) for _ in range(self.bo_init)]
        scored = [score(z) for z in zs]
        if n < 2 or self.bo_iterations == 0:
            return min(scored, key=lambda s: s[:2])[2]
        kernel = self._kernel or ConstantKernel(1.0) * Matern(length_scale=w, nu=2.5)
        for it in range(self.bo_iterations):
            y = np.array([s[0] for s in scored])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                gp = GaussianProcessRegressor(
                    kernel=kernel,
                    alpha=1e-6,
                    normalize_y=True,
                    optimizer="fmin_l_bfgs_b" if it == 0 else None,
                )
                gp.fit(np.array(zs), y)
            kernel = gp.kernel_  # hyper-parameters fitted once per search, then reused
            best = int(np.argmin(y))
            cand = np.concatenate(
                [
                    self.rng.uniform(-w, w, (_EI_CANDIDATES // 2, n)),
                    np.clip(zs[best] + self.rng.normal(0.0, w / 4, (_EI_CANDIDATES // 2, n)), -w, w),
                ]
            )
            mu, sd = gp.predict(cand, return_std=True)
            sd = np.maximum(sd, 1e-12)
            gain = y[best] - mu
            zscore = gain / sd
            ei = gain * scipy.stats.norm.cdf(zscore) + sd * scipy.stats.norm.pdf(zscore)
            z_next = cand[int(np.argmax(ei))]
            zs.append(z_next)
            scored.append(score(z_next))
        self._kernel = kernel
        return min(scored, key=lambda s: s[:2])[2]

    # --- the decision ----------------------------------------------------------------------------
    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        # The matrices are tiny: one BLAS thread is ~50x faster than several fighting for cores.
        with single_blas_thread():
            return self._decide(info)

    def _decide(self, info: dict[str, Any]) -> tuple[np.ndarray, None]:
        report = info["report"]
        self._step += 1
        current = np.asarray(info["local_batches"], dtype=np.int64)
        alive = report.alive & (report.compute_time_s > 0)
        fired = False
        for i in np.flatnonzero(alive):
            self.models[i].add(self._step, float(report.local_batch[i]), float(report.compute_time_s[i]))
            fired |= self._trigger(i, report.wall_time_s)
        changed_m = self._update_global_batch(report)
        self.batch_history.append(self.global_batch)
        if not alive.any():
            return current.astype(np.float32), None

        workers = np.flatnonzero(alive)
        lo, hi = self.spec.min_batch[alive], self.spec.max_batch[alive]
        m = int(np.clip(self.global_batch, lo.sum(), hi.sum()))
        table = self._table(workers)
        split, _ = equal_time_split(self._grid, table, np.array([m]), lo, hi)
        base = round_to_total(split[0], m, lo, hi)
        t_now = self._times(table, current[alive]).max()
        t_base = self._times(table, base).max()
        target = current.copy()
        must = changed_m or fired or current[alive].sum() != m
        if must or t_base < (1.0 - self.min_gain) * t_now:
            split = self._bo_split(base.astype(np.float64), m, lo, hi, table)
            if must or self._times(table, split).max() < (1.0 - self.min_gain) * t_now:
                target[alive] = split
        return target.astype(np.float32), None
