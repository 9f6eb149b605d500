"""The fast path's gradient factors (:meth:`sim.batched_noise.BatchNoise._gradient_factors`) against
the K gamma draws they stand for: the same law, by two-sample tests that a wrong constant fails."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from sim import batched_noise
from sim.batched_noise import BatchNoise
from sim.batched_world import GRAD_GAMMA

CLUSTERS, WIDTH = 12_500, 8  # 10^5 workers


def _fields(grad_mean, grad_root_mean, grad_global) -> dict[str, np.ndarray]:
    return {
        "mean": grad_mean.ravel(),
        "root mean": grad_root_mean.ravel(),
        "root variance": (grad_mean - grad_root_mean**2).ravel(),  # what the report reads
        "global": grad_global.ravel(),
    }


def _fast(k: int, seed: int) -> dict[str, np.ndarray]:
    d = BatchNoise(np.random.default_rng(seed)).draw(np.arange(CLUSTERS), k, np.full(CLUSTERS, WIDTH), WIDTH)
    return _fields(d.grad_mean, d.grad_root_mean, d.grad_global)


def _exact(k: int, seed: int) -> dict[str, np.ndarray]:
    """What the SimPy engine draws: K + 1 gamma factors per worker, the last the all-reduced one's."""
    shape, scale = GRAD_GAMMA
    g = np.random.default_rng(seed).gamma(shape, scale, (k + 1, CLUSTERS, WIDTH))
    return _fields(g[:k].mean(axis=0), np.sqrt(g[:k]).mean(axis=0), g[k].mean(axis=1))


def _p_values(k: int) -> dict[str, float]:
    fast, exact = _fast(k, seed=1), _exact(k, seed=2)
    return {name: stats.ks_2samp(fast[name], exact[name]).pvalue for name in fast}


def _skew_gap(k: int) -> float:
    """Sample skewness of the root mean, fast path minus exact, in standard errors (sqrt(6 / n))."""
    fast, exact = _fast(k, seed=1)["root mean"], _exact(k, seed=2)["root mean"]
    return (stats.skew(fast) - stats.skew(exact)) / np.sqrt(6.0 / len(fast))


@pytest.mark.parametrize("k", [50, 7, 1])
def test_the_fast_gradient_factors_have_the_law_of_the_k_draws(k):
    p = _p_values(k)
    if k == 1:  # no spread (exactly 0 here, rounding's ~1e-17 there): test_one_iteration_has_no_spread
        del p["root variance"]
    assert min(p.values()) > 1e-3, p
    assert abs(_skew_gap(k)) < 4.0


def test_a_wrong_root_variance_fails_the_comparison(monkeypatch):
    mu, var, skew = batched_noise.ROOT_MOMENTS
    monkeypatch.setattr(batched_noise, "ROOT_MOMENTS", (mu, var * 1.05, skew))
    p = _p_values(50)
    assert p["root variance"] < 1e-3 and p["mean"] < 1e-3, p


def test_a_missing_skewness_fails_the_comparison(monkeypatch):
    mu, var, _ = batched_noise.ROOT_MOMENTS
    monkeypatch.setattr(batched_noise, "ROOT_MOMENTS", (mu, var, 0.0))
    assert abs(_skew_gap(1)) > 4.0


def test_one_iteration_has_no_spread():
    fast = _fast(1, seed=3)
    assert np.array_equal(fast["root variance"], np.zeros_like(fast["root variance"]))
