"""Statistics that controllers and the observation encoder estimate from interval reports (the
gradient noise scale; the efficiency and gain formulas that use it are in :mod:`sim.scaling`)."""

from __future__ import annotations

from operator import mul

from sim.protocol import IntervalReport

#: Upper bound on a reported noise-scale estimate (the estimate diverges when |G|^2 ~ 0).
MAX_NOISE_SCALE = 1e7


def two_batch_estimates(report: IntervalReport) -> tuple[float, float] | None:
    """Unbiased estimates of (|G|^2, tr(Sigma)) from one interval (McCandlish et al. 2018, App. A).

    Each live worker's squared local-gradient norm and the all-reduced one satisfy
    E|g_B|^2 = |G|^2 + tr(Sigma) / B. With equal local batches the least-squares line through the
    points (1/B, |g_B|^2) is exactly the two-batch estimator; with uneven batches it generalises it.
    Returns ``None`` when fewer than two distinct batch sizes were measured.
    """
    live = report.alive
    if False not in live.tolist():
        b, y = report.local_batch, report.local_grad_sqr
    else:
        b, y = report.local_batch[live], report.local_grad_sqr[live]
    n = b.size
    if n == 0 or report.global_batch <= 0:
        return None
    # Weighted least squares of y on x = 1/B; the global point weighs as much as all local points
    # together (it averages as many samples). Closed form with sums over Python lists: this runs
    # every interval on a handful of workers, where a numpy reduction costs more than the maths.
    x, yl = (1.0 / b).tolist(), y.tolist()
    xg, yg = 1.0 / report.global_batch, float(report.global_grad_sqr)
    sx, sy = sum(x), sum(yl)
    w = 2.0 * n
    xm = (sx + n * xg) / w
    ym = (sy + n * yg) / w
    # Centred sums via raw moments: sum (x - xm)^2 = sum x^2 - 2 xm sum x + n xm^2, etc.
    sxx = sum(map(mul, x, x)) - 2.0 * xm * sx + n * xm * xm + n * (xg - xm) ** 2
    if sxx <= 1e-12 * max(xm * xm, 1e-300):
        return None
    sxy = sum(map(mul, x, yl)) - xm * sy - ym * sx + n * xm * ym + n * (xg - xm) * (yg - ym)
    s = sxy / sxx
    return float(ym - s * xm), float(s)


class NoiseScaleEstimator:
    """Gradient noise scale B_simple = tr(Sigma) / |G|^2 from exponential moving averages of the
    two-batch estimates (the ratio of averages is far less biased than the average of ratios).

    Args:
        smoothing: EMA weight of the newest interval, in (0, 1].
    """

    def __init__(self, smoothing: float = 0.2) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.smoothing = smoothing
        self.reset()

    def reset(self) -> None:
        self.grad_sqr: float | None = None
        self.trace_sigma: float | None = None

    def update(self, report: IntervalReport) -> float | None:
        est = two_batch_estimates(report)
        if est is not None:
            g2, s = est
            if self.grad_sqr is None:
                self.grad_sqr, self.trace_sigma = g2, s
            else:
                a = self.smoothing
                self.grad_sqr += a * (g2 - self.grad_sqr)
                self.trace_sigma += a * (s - self.trace_sigma)
        return self.noise_scale

    @property
    def noise_scale(self) -> float | None:
        """Current B_simple estimate (samples), or ``None`` before the first usable interval."""
        if self.grad_sqr is None:
            return None
        if self.trace_sigma <= 0:
            return 1.0
        if self.grad_sqr <= self.trace_sigma / MAX_NOISE_SCALE:
            return MAX_NOISE_SCALE
        return float(self.trace_sigma / self.grad_sqr)
