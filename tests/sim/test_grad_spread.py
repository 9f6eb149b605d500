"""The gradient spread: the default gamma factors, a spread fitted to real ranks, its checks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.batched_world import WorldArrays
from sim.convergence import (
    GRAD_NOISE_DOF,
    GRAD_NORM_CV_RANGE,
    ConvergenceModel,
    convergence_params,
    gamma_shape_for_norm_cv,
    norm_cv_of_gamma_shape,
)
from sim.engine import Simulator


def test_a_model_without_a_fitted_spread_draws_what_the_engine_always_drew():
    model = ConvergenceModel(convergence_params("cifar10"))
    b = np.array([32, 64, 128])
    got = model.grad_noise(np.random.default_rng(7), b, 51)
    want = np.random.default_rng(7).gamma(GRAD_NOISE_DOF / 2.0, 2.0 / GRAD_NOISE_DOF, (51, 3))
    np.testing.assert_array_equal(got, want)


def test_the_shape_for_a_spread_inverts_the_spread_of_a_shape():
    cv = np.geomspace(*GRAD_NORM_CV_RANGE, 200)
    np.testing.assert_allclose(norm_cv_of_gamma_shape(gamma_shape_for_norm_cv(cv)), cv, rtol=1e-4)
    assert norm_cv_of_gamma_shape(GRAD_NOISE_DOF / 2.0) == pytest.approx(0.1002, abs=1e-4)
    rng = np.random.default_rng(0)
    for c in (0.05, 0.3, 1.2):  # against plain draws: sqrt of a mean-1 gamma of that shape
        a = gamma_shape_for_norm_cv(c)
        x = np.sqrt(rng.gamma(a, 1.0 / a, 400_000))
        assert x.std() / x.mean() == pytest.approx(c, rel=0.01)


def _spread(sim_params, batches, intervals=40, k=50):
    """Median over intervals of each worker's reported sd / mean of its gradient norm."""
    sim = Simulator("t4v100", "cifar10", "static_hetero", convergence_params=sim_params)
    sim.reset(seed=3)
    out = [sim.run_interval(batches, k) for _ in range(intervals)]
    return np.median([np.sqrt(r.grad_norm_var) / r.grad_norm_mean for r in out], axis=0)


def test_the_engine_reports_the_fitted_spread_at_each_worker_s_batch():
    base = convergence_params("cifar10")
    b = np.where(np.arange(Simulator("t4v100").num_workers) % 2 == 0, 32, 128)
    fitted = replace(base, grad_norm_cv=0.3, grad_norm_cv_exponent=0.25)
    got = _spread(fitted, b)
    want = ConvergenceModel(fitted).grad_norm_cv_at(b)
    np.testing.assert_allclose(got, want, rtol=0.08)  # K = 50: the sample cv's bias is ~1 %
    flat = _spread(base, b)  # the default: ~0.1 at every batch
    np.testing.assert_allclose(flat, 0.1, rtol=0.08)
    assert not np.allclose(got, flat, rtol=0.5)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"grad_norm_cv": 5.0}, r"grad_norm_cv must be in \[0\.01, 3\]"),
        ({"grad_norm_cv": 0.0}, r"grad_norm_cv"),
        ({"grad_norm_cv_exponent": 0.3}, r"grad_norm_cv_exponent needs grad_norm_cv"),
        ({"grad_norm_cv": 0.2, "grad_norm_cv_exponent": 3.0}, r"grad_norm_cv_exponent must be in \[-2, 2\]"),
    ],
)
def test_a_bad_spread_is_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        replace(convergence_params("cifar10"), **change)


def test_the_batched_engine_refuses_a_world_it_would_draw_wrongly():
    fitted = replace(convergence_params("cifar10"), grad_norm_cv=0.3)
    sim = Simulator("t4v100", "cifar10", convergence_params=fitted)
    with pytest.raises(ValueError, match="fitted gradient spread"):
        WorldArrays(1, sim.num_workers).set(0, sim)


def test_the_all_reduced_estimate_averages_the_interval_as_the_ranks_do():
    """With a fitted spread the global |g|^2 factor is the mean over the interval's iterations (the
    ranks average it over them); the default keeps its one extra row of draws."""
    base = convergence_params("cifar10")

    def factors(params):
        sim = Simulator("t4v100", "cifar10", "static_hetero", convergence_params=params)
        sim.reset(seed=5)
        b = np.full(sim.num_workers, 64)
        out = []
        for _ in range(60):
            r = sim.run_interval(b, 50)
            g2, v = r.truth["grad_sqr"], r.truth["grad_var"]
            out.append(r.global_grad_sqr / (g2 + v * base.base_batch / b.sum()))
        return np.array(out)

    wide = factors(replace(base, grad_norm_cv=0.45))
    assert (
        wide.mean() == pytest.approx(1.0, abs=0.02) and wide.std() < 0.08
    )  # ~0.9 / sqrt(400); one row: 0.32
    rng = np.random.default_rng(0)
    assert ConvergenceModel(base).global_grad_factor(m := rng.gamma(2.0, 0.5, (51, 4))) == m[-1].mean()
    assert factors(base).std() == pytest.approx(0.2 / np.sqrt(8), rel=0.3)  # one row of 8 draws
