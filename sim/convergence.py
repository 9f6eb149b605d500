"""Training-progress model: gradient noise, statistical efficiency and validation accuracy.

Calibrated from real convergence traces (Pollux artifact) by ``python -m experiments.fit_convergence``
(see ``sim/fitting/convergence.py``); the fitted parameters live in ``sim/data/convergence_models.json``.

Progress is counted in steps of the base batch ``M0`` (as in the traces and in Pollux): one
optimiser step at global batch ``M`` advances progress by ``r(M, p)`` base-batch steps.

    |G|^2(p)          = exp(PCHIP(progress_knots, log_grad_sqr)(p))      # true gradient, squared
    B_noise(p)        = M0 * exp(PCHIP(progress_knots, log_grad_var - log_grad_sqr)(p))
                                                                         # McCandlish's B_simple
    tr(Sigma)/M0 (p)  = |G|^2(p) * B_noise(p) / M0                       # per-M0-batch variance
    E(M, p), r_ada(M, p), r(M, p)                # efficiency, AdaScale gain and progress per step
                                                 # at B_noise(p): see sim.scaling (LR_RULES)

A model may set the noise that decides a batch's benefit to progress apart from the one the
statistics give (``progress_noise_factor`` k, fitted to the measured steps to target; 1 by default).
The simulator then keeps two counters: the gradient statistics' ``q``, advanced by the rule's gain
at B_noise(q) (the progress real AdaScale counts; its estimator's noise scale is a function of it),
and the accuracy's progress ``p``, advanced by the rule's gain at k B_noise(q). The reported
gradient statistics, the noise scale a controller reads and AdaScale's learning rate
(``lr_multiplier``) follow q. Real AdaScale on a task whose estimator sees little noise (the
byte-level LM: B_noise ~ 1 sample) barely raises its learning rate, and its estimate rises with
the steps taken at every batch, yet a larger batch still takes fewer steps to the target.

Within an interval a worker's squared gradient norm varies from iteration to iteration around
E|g_b|^2 = |G|^2 + tr(Sigma)/b by a gamma factor of mean 1. Its shape is GRAD_NOISE_DOF / 2 (a
relative s.d. of the norm of ~0.1, chosen when no data held it) unless the model carries a spread
fitted to real ranks (``grad_norm_cv`` c, ``grad_norm_cv_exponent`` e; ``python -m
experiments.fit_grad_spread``): then at local batch b the norm's coefficient of variation over the
iterations is c (b / M0) ** e, and the shape is the one whose square root has that spread
(:func:`gamma_shape_for_norm_cv`), and the all-reduced gradient's factor is the mean over the interval's
iterations, as the ranks average it (:meth:`ConvergenceModel.global_grad_factor`).

The statistics are held constant outside the fitted knots. r_ada lies in [1, M / M0] for M >= M0:
a batch of M is worth at most M / M0 base steps, and at least one. Without learning-rate scaling
(``none``) a larger batch only lowers the gradient noise of a base-LR step, so its gain is at most
that of the sqrt rule (none_exponent <= 1/2); none_exponent = 0 is one base step per step.
Hence r_adascale = r_linear >= r_sqrt >= r_none >= min(1, r_ada), before the learning-rate
stability factor ``sim.scaling.lr_stability`` (``lr_stable_gain``, ``lr_unstable_exponent``; no
limit unless fitted), which can make a rule that raises the learning rate slower than ``none``.

"Accuracy" below is the workload's validation quality, a fraction that rises as the model trains:
the accuracy itself for the shipped workloads, any other metric (a falling WER or loss too) mapped
by ``sim.workloads.QualityMetric``. It depends on progress and on the batch the model has been
trained with lately (the generalisation gap of large batches), remembered as an exponential moving average ``m`` of
log2(M) over progress with time constant ``batch_memory_progress``:

    m            <- m + (1 - exp(-dp / batch_memory_progress)) * (log2(M) - m)
    ceiling(m)    = acc_ceiling - gap_per_doubling * max(0, m - log2(ref_batch))
    stretch(m)    = 2 ** (stretch_exponent * max(0, m - log2(ref_batch)))
    acc(p, m)     = acc_chance + (ceiling(m) - acc_chance) * shape(p / stretch(m))
    train_acc     = min(1, acc + train_gap * clip(p / total_progress, 0, 1))

``shape`` is a monotone PCHIP through fitted knots, 0 at x = 0 and 1 at (and beyond) the last knot,
in progress units of the reference batch. A static run has m = log2(M).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
from scipy.interpolate import PchipInterpolator
from scipy.special import gammaln

from sim.datafiles import data_path, load_param_table
from sim.scaling import (
    LR_RULES,
    adascale_gain,
    advance,
    lr_gain,
    lr_stability,
    progress_gain,
    statistical_efficiency,
)
from sim.validation import check_choice, check_positive, check_range

CONVERGENCE_MODELS_FILE = "convergence_models.json"

_KNOT_FIELDS = ("progress_knots", "log_grad_sqr", "log_grad_var", "shape_x", "shape_y")

#: Resolution of the lookup tables that replace spline calls on the simulator's hot path.
_TABLE_POINTS = 4096
#: Future progress points at which :meth:`ConvergenceModel.progress_to_accuracy` reads a held batch.
_HELD_POINTS = 1024
#: Effective dimensionality of gradient noise of a model without a fitted spread: sets the
#: iteration-to-iteration spread of |g|^2 (relative s.d. sqrt(2 / d); of the norm ~sqrt(1 / (2 d))).
#: Not identifiable from the traces, which hold per-epoch means; real ranks' timelines hold it
#: (``grad_norm_cv``).
GRAD_NOISE_DOF = 50.0
#: The fields of a gradient spread fitted to real ranks (``experiments.fit_grad_spread``), which a
#: refit of the rest of the model keeps.
GRAD_SPREAD_FIELDS = ("grad_norm_cv", "grad_norm_cv_exponent")
#: Coefficients of variation of the gradient norm a fitted spread may give, at any batch.
GRAD_NORM_CV_RANGE = (0.01, 3.0)


def norm_cv_of_gamma_shape(shape: np.ndarray | float) -> np.ndarray:
    """Coefficient of variation of sqrt(X) for X ~ Gamma(shape, 1 / shape) (mean 1):
    E sqrt(X) = Gamma(a + 1/2) / (Gamma(a) sqrt(a)), cv = sqrt(1 - E^2) / E."""
    a = np.asarray(shape, dtype=np.float64)
    log_mean_root = gammaln(a + 0.5) - gammaln(a) - 0.5 * np.log(a)
    return np.sqrt(-np.expm1(2.0 * log_mean_root)) * np.exp(-log_mean_root)


#: log shape -> log cv, decreasing: the table :func:`gamma_shape_for_norm_cv` inverts.
_SHAPE_GRID = np.geomspace(1e-2, 1e5, 8192)
_LOG_CV_GRID = np.log(norm_cv_of_gamma_shape(_SHAPE_GRID))


def gamma_shape_for_norm_cv(cv: np.ndarray | float) -> np.ndarray:
    """The gamma shape a (mean-1 factor of |g|^2) whose square root has coefficient of variation
    ``cv`` (the inverse of :func:`norm_cv_of_gamma_shape`, log-interpolated; relative error < 1e-4
    over :data:`GRAD_NORM_CV_RANGE`)."""
    log_cv = np.log(np.asarray(cv, dtype=np.float64))
    return np.exp(np.interp(-log_cv, -_LOG_CV_GRID, np.log(_SHAPE_GRID)))


@dataclass(frozen=True)
class ConvergenceParams:
    """Fitted convergence model of one workload (see the module docstring for the equations)."""

    name: str
    base_batch: int  # M0
    total_progress: float  # progress at which the reference runs ended
    progress_knots: tuple[float, ...]
    log_grad_sqr: tuple[float, ...]
    log_grad_var: tuple[float, ...]
    acc_chance: float
    acc_ceiling: float
    ref_batch: float
    gap_per_doubling: float
    stretch_exponent: float
    shape_x: tuple[float, ...]  # knots of shape(), in progress units of the reference batch
    shape_y: tuple[float, ...]
    batch_memory_progress: float
    none_exponent: float = 0.0  # lr_rule "none": gain (M / M0) ** none_exponent, capped by r_ada
    # Parameters added after plans were cached against this model's repr: kept out of the repr so
    # that at their defaults (the model unchanged) the cached plans' keys stay (see model_extras).
    lr_stable_gain: float | None = field(default=None, repr=False)  # g_s of sim.scaling.lr_stability
    lr_unstable_exponent: float = field(default=1.0, repr=False)  # q of sim.scaling.lr_stability
    # k >= 1: the noise that sets a batch's benefit to progress is k times the one the gradient
    # statistics (and so AdaScale's estimator and the reports) give (fitted to steps to target)
    progress_noise_factor: float = field(default=1.0, repr=False)
    train_gap: float = 0.0  # training-batch accuracy above validation accuracy, at the end
    # the gradient norm's coefficient of variation over an interval's iterations at local batch M0
    # and its power in the local batch, fitted to real ranks (None: GRAD_NOISE_DOF)
    grad_norm_cv: float | None = field(default=None, repr=False)
    grad_norm_cv_exponent: float = field(default=0.0, repr=False)
    fit_rmse: float = float("nan")  # RMSE of accuracy over the traces, metric units

    def __post_init__(self) -> None:
        n = self.name
        for f in _KNOT_FIELDS:  # JSON gives lists: store hashable tuples of floats
            object.__setattr__(self, f, tuple(float(v) for v in getattr(self, f)))
        check_range(f"{n}.base_batch", self.base_batch, 1)
        check_positive(f"{n}.total_progress", self.total_progress)
        if not (len(self.progress_knots) == len(self.log_grad_sqr) == len(self.log_grad_var) >= 2):
            raise ValueError(f"{n}: progress_knots, log_grad_sqr and log_grad_var need equal lengths >= 2")
        if len(self.shape_x) != len(self.shape_y) or len(self.shape_x) < 2:
            raise ValueError(f"{n}: shape_x and shape_y need equal lengths >= 2")
        for f in _KNOT_FIELDS:
            if not all(math.isfinite(v) for v in getattr(self, f)):
                raise ValueError(f"{n}.{f} must be finite numbers")
        if np.any(np.diff(self.progress_knots) <= 0) or self.progress_knots[0] < 0:
            raise ValueError(f"{n}.progress_knots must be >= 0 and strictly increasing")
        if self.shape_x[0] != 0.0 or np.any(np.diff(self.shape_x) <= 0):
            raise ValueError(f"{n}.shape_x must start at 0 and increase strictly")
        sy = np.asarray(self.shape_y)
        if sy[0] != 0.0 or abs(sy[-1] - 1.0) > 1e-9 or np.any(np.diff(sy) < 0):
            raise ValueError(f"{n}.shape_y must rise monotonically from 0 to 1, got {self.shape_y}")
        check_range(f"{n}.acc_chance", self.acc_chance, 0.0, 1.0)
        check_range(f"{n}.acc_ceiling", self.acc_ceiling, self.acc_chance, 1.0)
        check_range(f"{n}.gap_per_doubling", self.gap_per_doubling, 0.0, 1.0)
        check_positive(f"{n}.ref_batch", self.ref_batch)
        check_positive(f"{n}.batch_memory_progress", self.batch_memory_progress)
        check_range(f"{n}.none_exponent", self.none_exponent, 0.0, 0.5)
        if self.lr_stable_gain is not None:
            check_range(f"{n}.lr_stable_gain", self.lr_stable_gain, 1.0)
        check_range(f"{n}.lr_unstable_exponent", self.lr_unstable_exponent, 0.0, 10.0)
        check_range(f"{n}.progress_noise_factor", self.progress_noise_factor, 1.0, 1e4)
        check_range(f"{n}.train_gap", self.train_gap, 0.0, 1.0)
        if self.grad_norm_cv is not None:
            check_range(f"{n}.grad_norm_cv", self.grad_norm_cv, *GRAD_NORM_CV_RANGE)
        elif self.grad_norm_cv_exponent != 0.0:
            raise ValueError(f"{n}.grad_norm_cv_exponent needs grad_norm_cv (a fitted spread)")
        check_range(f"{n}.grad_norm_cv_exponent", self.grad_norm_cv_exponent, -2.0, 2.0)

    def model_extras(self) -> dict[str, float]:
        """The fields outside the repr whose values differ from their defaults (they change the
        model, so whatever is keyed by the repr must add them)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not f.repr and getattr(self, f.name) != f.default}  # fmt: skip


def with_gradient_noise(
    params: ConvergenceParams, noise_factor: float, progress_noise_factor: float | None = None
) -> ConvergenceParams:
    """``params`` whose gradient noise scale B_noise is ``noise_factor`` times its own at every
    progress (the variance knots shifted by ln(noise_factor), the squared norm kept), and whose
    progress noise factor k is ``progress_noise_factor`` (kept when None): a generated workload
    whose batch dependence differs from the fitted one's (a noise of a few samples, as the real CPU
    tasks' AdaScale estimators report, where the shipped workloads' lie at 10^2-10^7)."""
    check_range("noise_factor", noise_factor, 1e-8, 1e8)
    k = params.progress_noise_factor if progress_noise_factor is None else progress_noise_factor
    shift = math.log(noise_factor)
    return replace(
        params,
        log_grad_var=tuple(v + shift for v in params.log_grad_var),
        progress_noise_factor=float(k),
    )


def with_horizon(params: ConvergenceParams, factor: float) -> ConvergenceParams:
    """``params`` with every quantity counted in progress (the statistics' and the shape's knots, the
    total progress, the batch memory's time constant) times ``factor``: the same curves of accuracy
    and gradient statistics over the fraction of training done, reached in ``factor`` times the
    steps. A generated workload whose run to the target takes a few dozen decisions, as the real
    CPU tasks' do (the shipped workloads' take hundreds), so that a policy sees quality gains per
    interval of the size those runs show."""
    check_range("horizon_factor", factor, 1e-6, 1e6, low_open=True)
    f = float(factor)
    return replace(
        params,
        total_progress=params.total_progress * f,
        progress_knots=tuple(x * f for x in params.progress_knots),
        shape_x=tuple(x * f for x in params.shape_x),
        batch_memory_progress=params.batch_memory_progress * f,
    )


def with_batch_dependence(
    params: ConvergenceParams, stretch_exponent: float, memory_fraction: float
) -> ConvergenceParams:
    """``params`` whose large batches stretch the progress a quality needs by ``stretch_exponent``
    per doubling above the reference batch, remembered over ``memory_fraction`` of the run's total
    progress (the batch memory's time constant): a generated workload whose batch dependence is the
    one the real tasks' runs show when their batches change (``python -m experiments.fit_campaigns``:
    stretch 0.07 / 0.31, memory 0.45 / 0.67 of the run on the LM / CNN), where every shipped model
    keeps the static fit's (stretch 0-0.07, and a memory of a tenth of the run that no data set, so
    that an early large batch is nearly forgotten by the target)."""
    check_range("stretch_exponent", stretch_exponent, 0.0, 4.0)
    check_range("memory_fraction", memory_fraction, 0.0, 100.0, low_open=True)
    return replace(
        params,
        stretch_exponent=float(stretch_exponent),
        batch_memory_progress=float(memory_fraction) * params.total_progress,
    )


def convergence_table(path: str | Path | None = None) -> dict[tuple[str], ConvergenceParams]:
    return load_param_table(ConvergenceParams, path or data_path(CONVERGENCE_MODELS_FILE), ("name",))


def convergence_params(name: str, path: str | Path | None = None) -> ConvergenceParams:
    table = convergence_table(path)
    check_choice("convergence model", name, {k for (k,) in table})
    return table[(name,)]


class ConvergenceModel:
    """Evaluates :class:`ConvergenceParams` quickly (table lookups, no spline calls per step)."""

    def __init__(self, params: ConvergenceParams, lr_rule: str = "adascale") -> None:
        self.params = params
        self.lr_rule = check_choice("lr_rule", lr_rule, LR_RULES)
        self.base_batch = params.base_batch
        knots = np.asarray(params.progress_knots, dtype=np.float64)
        # Tabulate on a fine grid once; np.interp on the grid is ~50x cheaper than a PCHIP call.
        # np.interp clamps, so the statistics are held constant outside the measured range.
        self._grid = np.linspace(knots[0], knots[-1], _TABLE_POINTS)
        log_ratio = np.subtract(params.log_grad_var, params.log_grad_sqr)
        # B_noise is interpolated as one curve (PCHIP keeps monotone knots monotone), and the
        # variance follows from it, so that grad_var / grad_sqr is exactly B_noise / M0.
        self._log_sqr = PchipInterpolator(knots, params.log_grad_sqr)(self._grid)
        self._log_ratio = PchipInterpolator(knots, log_ratio)(self._grid)
        self._log_var = self._log_sqr + self._log_ratio
        self._noise = self.base_batch * np.exp(self._log_ratio)
        #: the noise scale that sets progress (k B_noise; the same table when k = 1)
        k = params.progress_noise_factor
        self._progress_noise = self._noise if k == 1.0 else k * self._noise
        sx = np.asarray(params.shape_x, dtype=np.float64)
        self._shape_grid = np.linspace(0.0, sx[-1], _TABLE_POINTS)
        self._shape = np.clip(PchipInterpolator(sx, params.shape_y)(self._shape_grid), 0.0, 1.0)
        self._log2_ref = math.log2(params.ref_batch)
        #: the guards' cap on the learning-rate multiplier and their back-off (sim.guards; a guarded
        #: backend sets them): None and 1 leave the rule's rate as it is
        self.max_gain: float | None = None
        self.lr_scale = 1.0

    # --- gradient statistics -------------------------------------------------------------------
    def grad_stats(self, progress: float) -> tuple[float, float]:
        """(|G|^2, tr(Sigma)/M0) at ``progress``; held constant outside the fitted knots."""
        g = math.exp(np.interp(progress, self._grid, self._log_sqr))
        v = math.exp(np.interp(progress, self._grid, self._log_var))
        return g, v

    def grad_noise(self, rng: np.random.Generator, local_batch: np.ndarray, rows: int) -> np.ndarray:
        """``rows`` x workers mean-1 gamma factors of each worker's |g|^2 at its ``local_batch``: shape
        GRAD_NOISE_DOF / 2 everywhere, or the fitted spread's (see the module docstring)."""
        p = self.params
        if p.grad_norm_cv is None:
            return rng.gamma(GRAD_NOISE_DOF / 2.0, 2.0 / GRAD_NOISE_DOF, (rows, len(local_batch)))
        shape = gamma_shape_for_norm_cv(self.grad_norm_cv_at(local_batch))
        return rng.gamma(shape, 1.0 / shape, (rows, len(local_batch)))

    def global_grad_factor(self, factors: np.ndarray) -> float:
        """The all-reduced gradient's |g|^2 factor over an interval, from :meth:`grad_noise`'s K + 1
        rows: the last row's mean over the workers; with a fitted spread the mean over the first K
        rows (the ranks report the all-reduced norm averaged over the interval's iterations, and one
        row of a wide spread would give the noise estimate a scatter the ranks' does not have)."""
        if self.params.grad_norm_cv is None:
            return float(factors[-1].mean())
        return float(factors[:-1].mean())

    def grad_norm_cv_at(self, local_batch: np.ndarray) -> np.ndarray:
        """The fitted spread's coefficient of variation of the gradient norm at ``local_batch``,
        within :data:`GRAD_NORM_CV_RANGE` (the model gives no spread outside it)."""
        p = self.params
        if p.grad_norm_cv is None:
            raise ValueError(f"{p.name} has no fitted gradient spread (grad_norm_cv)")
        b = np.maximum(np.asarray(local_batch, dtype=np.float64), 1.0)
        return np.clip(p.grad_norm_cv * (b / self.base_batch) ** p.grad_norm_cv_exponent, *GRAD_NORM_CV_RANGE)

    def noise_scale(self, progress: float) -> float:
        """B_noise = M0 * grad_var / grad_sqr at ``progress``."""
        return float(np.interp(progress, self._grid, self._noise))

    def efficiency(self, global_batch: float, progress: float) -> float:
        """E(M, p) = (B_noise + M0) / (B_noise + M): in (0, 1] for M >= M0."""
        return statistical_efficiency(self.noise_scale(progress), global_batch, self.base_batch)

    @property
    def split_noise(self) -> bool:
        """Whether the progress noise differs from the reported one (``progress_noise_factor`` != 1):
        the gradient statistics then follow :meth:`noise_progress_per_step`'s counter."""
        return self._progress_noise is not self._noise

    def progress_per_step(
        self, global_batch: float, progress: float, noise_progress: float | None = None
    ) -> float:
        """Base-batch steps advanced by one optimiser step at ``global_batch`` (rule dependent), the
        gradient statistics read at ``noise_progress`` (None: at ``progress``; a simulator with a
        :attr:`split_noise` model passes its noise counter)."""
        p = self.params
        at = progress if noise_progress is None else noise_progress
        if self._progress_noise is self._noise:
            b = b_lr = self.noise_scale(at)
        else:
            b = float(np.interp(at, self._grid, self._progress_noise))
            b_lr = self.noise_scale(at)
        return progress_gain(self.lr_rule, global_batch, self.base_batch, b, p.none_exponent,
                             p.lr_stable_gain, p.lr_unstable_exponent, self.max_gain, self.lr_scale, b_lr)  # fmt: skip

    def noise_progress_per_step(self, global_batch: float, noise_progress: float) -> float:
        """The advance of the gradient statistics' counter in one step: the rule's progress at the
        reported noise scale (the progress real AdaScale counts). The same as
        :meth:`progress_per_step` when the model's noise is not split."""
        b = self.noise_scale(noise_progress)
        p = self.params
        return progress_gain(self.lr_rule, global_batch, self.base_batch, b, p.none_exponent,
                             p.lr_stable_gain, p.lr_unstable_exponent, self.max_gain, self.lr_scale)  # fmt: skip

    def advance(
        self, global_batch: float, progress: float, noise_progress: float, steps: float
    ) -> tuple[float, float]:
        """(progress, noise counter) gained over ``steps`` steps at ``global_batch``, midpoint rule
        (:func:`sim.scaling.advance`); without a split the two are the same."""
        if not self.split_noise:
            dp = advance(self.progress_per_step, global_batch, progress, steps)
            return dp, dp
        dn = advance(self.noise_progress_per_step, global_batch, noise_progress, steps)
        return steps * self.progress_per_step(global_batch, progress, noise_progress + 0.5 * dn), dn

    def lr_multiplier(self, global_batch: float, progress: float) -> float:
        """The rule's learning rate at ``global_batch`` over the base one, capped and backed off as
        the guards set (:attr:`max_gain`, :attr:`lr_scale`)."""
        g = lr_gain(self.lr_rule, int(global_batch), self.base_batch, self.noise_scale(progress))
        return (g if self.max_gain is None else min(g, self.max_gain)) * self.lr_scale

    def noise_scale_many(self, progress: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`noise_scale` (for fitting and analysis, not the hot path)."""
        return np.interp(np.asarray(progress, dtype=np.float64), self._grid, self._noise)

    def progress_per_step_many(
        self, global_batch: np.ndarray, progress: np.ndarray, reported: bool = False
    ) -> np.ndarray:
        """Vectorised :meth:`progress_per_step` over broadcast arrays, the statistics read at
        ``progress``; ``reported=True``: :meth:`noise_progress_per_step` (the reported noise)."""
        m = np.asarray(global_batch, dtype=np.float64)
        x = np.asarray(progress, dtype=np.float64)
        b = np.interp(x, self._grid, self._noise if reported else self._progress_noise)
        scale = m / self.base_batch
        r_ada = adascale_gain(m, self.base_batch, b)
        p = self.params
        if self.lr_rule == "none":
            return np.minimum(scale**p.none_exponent, r_ada) * self.lr_scale
        if self.lr_rule == "sqrt":
            r, g = np.minimum(np.sqrt(scale), r_ada), np.sqrt(scale)
        elif self.lr_rule == "adascale":
            r = r_ada
            split = self.split_noise and not reported
            g = adascale_gain(m, self.base_batch, self.noise_scale_many(x)) if split else r_ada
        else:
            r, g = r_ada, scale
        if self.max_gain is not None or self.lr_scale != 1.0:  # the guards (sim.scaling.progress_gain)
            capped = (g if self.max_gain is None else np.minimum(g, self.max_gain)) * self.lr_scale
            split = self.lr_rule == "adascale" and self.split_noise and not reported
            r = r * np.minimum(1.0, capped / g) if split else np.minimum(r, capped)
            g = capped
        return r * lr_stability(g, p.lr_stable_gain, p.lr_unstable_exponent)

    # --- accuracy --------------------------------------------------------------------------------
    def initial_batch_memory(self, global_batch: float) -> float:
        return math.log2(global_batch)

    def update_batch_memory(self, memory_log2: float, global_batch: float, d_progress: float) -> float:
        """EMA (over progress) of log2 of the global batch."""
        w = 1.0 - math.exp(-d_progress / self.params.batch_memory_progress)
        return memory_log2 + w * (math.log2(global_batch) - memory_log2)

    def ceiling(self, memory_log2: float) -> float:
        """Accuracy plateau of a run remembered at log2 batch ``memory_log2``."""
        p = self.params
        doublings = max(0.0, memory_log2 - self._log2_ref)
        return max(p.acc_chance, p.acc_ceiling - p.gap_per_doubling * doublings)

    def stretch(self, memory_log2: float) -> float:
        """Progress slow-down factor max(1, m / ref_batch) ** stretch_exponent (>= 1)."""
        return 2.0 ** (max(0.0, memory_log2 - self._log2_ref) * self.params.stretch_exponent)

    def accuracy(self, progress: float, memory_log2: float) -> float:
        """True validation accuracy (a fraction) at ``progress``."""
        p = self.params
        s = float(np.interp(progress / self.stretch(memory_log2), self._shape_grid, self._shape))
        return p.acc_chance + (self.ceiling(memory_log2) - p.acc_chance) * s

    def progress_to_accuracy(
        self, accuracy: float, global_batch: np.ndarray, progress: float, memory_log2: float
    ) -> np.ndarray:
        """Progress at which the true validation accuracy first reaches ``accuracy`` if each global
        batch of ``global_batch`` is held from now on (``progress``, batch memory ``memory_log2``),
        the memory moving toward it as :meth:`update_batch_memory` moves it; ``math.inf`` where it
        is never reached. Vectorised over the batches: (C,) in, (C,) out."""
        p = self.params
        target = np.log2(np.asarray(global_batch, dtype=np.float64))[:, None]  # (C, 1)
        top_doublings = max(0.0, float(target.max()) - self._log2_ref, memory_log2 - self._log2_ref)
        end = max(progress, self._shape_grid[-1] * 2.0 ** (top_doublings * p.stretch_exponent))
        future = np.linspace(progress, end, _HELD_POINTS)[None, :]  # (1, G)
        memory = target + (memory_log2 - target) * np.exp(-(future - progress) / p.batch_memory_progress)
        acc = self.accuracy_many(future, memory)  # (C, G)
        above = acc >= accuracy
        first = np.argmax(above, axis=1)  # (C,): the first grid point at or above, 0 if none
        rows = np.arange(len(first))
        prev = np.maximum(first - 1, 0)
        a0, a1 = acc[rows, prev], acc[rows, first]
        x0, x1 = future[0, prev], future[0, first]
        rising = a1 > a0
        frac = np.divide(accuracy - a0, a1 - a0, out=np.ones_like(a0), where=rising)
        out = np.where(rising, x0 + frac * (x1 - x0), x1)  # linear inside the crossing cell
        return np.where(above[rows, first], out, math.inf)

    def accuracy_many(self, progress: np.ndarray, memory_log2: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`accuracy` over broadcast arrays."""
        p = self.params
        doublings = np.maximum(0.0, np.asarray(memory_log2, dtype=np.float64) - self._log2_ref)
        ceiling = np.maximum(p.acc_chance, p.acc_ceiling - p.gap_per_doubling * doublings)
        x = np.asarray(progress, dtype=np.float64) / 2.0 ** (doublings * p.stretch_exponent)
        s = np.interp(x, self._shape_grid, self._shape)
        return p.acc_chance + (ceiling - p.acc_chance) * s

    def train_accuracy(self, progress: float, memory_log2: float) -> float:
        """Accuracy on training batches: validation accuracy plus a gap that opens with progress."""
        frac = min(1.0, max(0.0, progress / self.params.total_progress))
        return min(1.0, self.accuracy(progress, memory_log2) + self.params.train_gap * frac)
