"""The gradient statistics a calibrated convergence model is fitted to: each interval's own two-batch
estimates (what a simulated report stands for), recorded by the curve runs or recovered exactly
from the real estimator's moving average."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from dynamix_gym.backends.sim_backend import SimBackend
from dynamix_gym.measurement.profiling import measure_curve
from dynamix_gym.stats import two_batch_estimates
from experiments.calibration.real import _curve, fit_curves, unsmooth
from sim.workloads import get_workload


def _ema(x: np.ndarray, a: float) -> np.ndarray:
    out = np.empty_like(x)
    out[0] = x[0]
    for t in range(1, len(x)):
        out[t] = out[t - 1] + a * (x[t] - out[t - 1])
    return out


@pytest.mark.parametrize("a", [0.2, 0.5, 1.0])
def test_unsmooth_inverts_the_estimators_moving_average(a):
    x = np.exp(np.random.default_rng(0).normal(size=30))  # a fast first interval, then noise
    x[0] = 40.0
    e = _ema(x, a)
    np.testing.assert_allclose(unsmooth(e, a), x, rtol=1e-9)
    # leading NaNs (no estimate yet) stay NaN; the rest is recovered
    lead = np.concatenate(([np.nan, np.nan], e))
    got = unsmooth(lead, a)
    assert np.isnan(got[:2]).all()
    np.testing.assert_allclose(got[2:], x, rtol=1e-9)
    # a wrong smoothing does not recover the series (the check can fail)
    if a != 1.0:
        assert not np.allclose(unsmooth(e, 1.0), x)


def _rows(g2_raw, gv_raw, a, with_raw):
    g2e, gve = _ema(np.asarray(g2_raw), a), _ema(np.asarray(gv_raw), a)
    rows = []
    for i, (g, v, ge, ve) in enumerate(zip(g2_raw, gv_raw, g2e, gve, strict=True)):
        row = {"steps": 20 * (i + 1), "progress": 20.0 * (i + 1), "val_accuracy": 0.1 + 0.01 * i,
               "train_accuracy": 0.1 + 0.01 * i, "grad_sqr": ge, "grad_var": ve}  # fmt: skip
        if with_raw:
            row.update(grad_sqr_raw=g, grad_var_raw=v)
        rows.append(row)
    return SimpleNamespace(global_batch=64, seed=0, rows=rows)


def test_a_curve_reads_the_raw_estimates_recorded_or_recovered():
    g2 = np.array([8.0, 0.3, 0.2, 0.25, 0.15])
    gv = np.array([0.15, 0.05, 0.06, 0.07, 0.05])
    recorded, older = _rows(g2, gv, 0.2, True), _rows(g2, gv, 0.2, False)
    np.testing.assert_allclose(_curve(recorded, "raw").grad_sqr, g2)
    np.testing.assert_allclose(_curve(older, "raw", 0.2).grad_sqr, g2, rtol=1e-9)
    np.testing.assert_allclose(_curve(older, "raw", 0.2).grad_var, gv, rtol=1e-9)
    ema = _curve(recorded, "ema")  # the fit before: the moving average, lagging the drop
    assert ema.grad_sqr[1] > 20 * g2[1]


def test_a_bad_grad_stats_setting_is_refused_by_name():
    cfg = OmegaConf.create({"curves": {"grad_stats": "smoothed"}})
    with pytest.raises(ValueError, match=r"curves\.grad_stats"):
        fit_curves(cfg, [], get_workload("cifar10"), {}, [])


def test_a_curve_run_records_each_intervals_own_estimates_beside_the_moving_average():
    backend = SimBackend("t4v100", "cifar10", "static_hetero")
    run = measure_curve(backend, 64, seed=3, iterations=10, progress_target=200.0, noise_smoothing=0.2)
    raw = np.array([r["grad_sqr_raw"] for r in run.rows])
    ema = np.array([r["grad_sqr"] for r in run.rows])
    assert np.isfinite(raw).all() and len(raw) >= 3
    np.testing.assert_allclose(unsmooth(ema, 0.2), raw, rtol=1e-6)
    assert not np.allclose(ema, raw)  # the two columns differ: the test can tell them apart
    # the first row's raw estimate is that interval's own two-batch estimate
    backend.reset(seed=3)
    first = two_batch_estimates(backend.run_interval(np.full(backend.spec.num_workers, 64), 10))
    assert raw[0] == pytest.approx(first[0])


def test_a_curve_run_leaves_out_the_first_intervals_estimate_as_the_real_rule_does():
    # a real backend whose guards leave the first interval's noise-scale estimate out of its rule
    # (sim.guards.GuardConfig.lr_gain_warmup) is replayed with the same gains
    backend = SimBackend("t4v100", "cifar10", "static_hetero")
    backend.lr_noise_warmup = 1
    run = measure_curve(backend, 64, seed=3, iterations=10, progress_target=200.0, noise_smoothing=0.2)
    rows = run.rows
    assert np.isnan(rows[0]["grad_sqr"]) and np.isfinite(rows[0]["grad_sqr_raw"])
    assert rows[1]["grad_sqr"] == pytest.approx(rows[1]["grad_sqr_raw"])  # the average starts there
    assert rows[1]["progress"] == pytest.approx(20.0)  # gain 1 through the second interval
    assert rows[2]["progress"] > 30.0  # then the estimate's gain (the global batch is above the base)


def test_an_episode_timeline_records_each_workers_gradient_norm_statistics():
    """A campaign's timelines keep what the policies' gradient features are computed from, so the
    simulator's gradient model can be fitted to real runs later."""
    from dynamix_gym.controllers import make_controller
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.evaluation import run_episode

    env = HeteroClusterEnv(
        cluster="t4v100", workload="ncf", scenario="static_hetero", interval=50, action_mode="absolute"
    )
    result = run_episode(env, make_controller("static", batch=64), seed=0, max_steps=3)
    n = env.unwrapped.num_workers
    for row in result.timeline:
        means = [row[f"w{i}_grad_norm_mean"] for i in range(n)]
        cvs = [np.sqrt(row[f"w{i}_grad_norm_var"]) / row[f"w{i}_grad_norm_mean"] for i in range(n)]
        assert all(m > 0 for m in means) and all(0 < c < 1 for c in cvs)
