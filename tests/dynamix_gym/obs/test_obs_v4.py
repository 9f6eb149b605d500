"""Observation schema 4: schema 3's features unchanged, plus each worker's compute elasticity read
from the spec's compute curve (checked against a plain reference); a spec without a curve is refused
with a message naming the field, before any interval where the caller allows it; the real backend
takes its curve from a calibrated profile, and an env takes a curve measured after it was built."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dynamix_gym import HeteroClusterEnv
from dynamix_gym.decision import DecisionStep
from dynamix_gym.obs import OBS_SCHEMA_V3, get_schema, make_encoder
from dynamix_gym.obs.v4 import OBS_SCHEMA_V4, CostAwareEncoder
from sim.hardware import ComputeModel
from sim.profile import load_profile, profile_compute_curve
from sim.protocol import compute_curve_batches, compute_elasticity

LM_REFIT = "results/deploy/lm_11/profile_refit"  # a quick calibration's refit on 2 CPU ranks (committed)


def _scaled(value: float, low: float, high: float) -> float:
    return -1.0 + 2.0 * (min(max(value, low), high) - low) / (high - low)


def _reference_elasticity(times, lo, hi, b):
    """The octave above b (below, at the top of the range), log-log interpolation: written plainly."""
    grid = np.exp(np.linspace(math.log(lo), math.log(hi), len(times)))
    x = math.log(min(max(b, lo), hi))
    top = math.log(hi)
    up = min(x + math.log(2), top)
    if up - x < 0.5 * math.log(2):
        x = max(up - math.log(2), math.log(lo))
    t = np.interp([x, up], np.log(grid), np.log(times))
    return (t[1] - t[0]) / (up - x)


@pytest.mark.parametrize("workload", ["cifar10", "ncf"])
def test_schema4_is_schema3_plus_each_workers_compute_elasticity(workload):
    assert get_schema(4) is OBS_SCHEMA_V4 and OBS_SCHEMA_V4.version == "4"
    fw3 = OBS_SCHEMA_V3.worker_dim
    assert OBS_SCHEMA_V4.worker_features[:fw3] == OBS_SCHEMA_V3.worker_features
    assert [f.name for f in OBS_SCHEMA_V4.worker_features[fw3:]] == ["compute_elasticity"]
    assert OBS_SCHEMA_V4.global_features == OBS_SCHEMA_V3.global_features
    envs = {
        v: HeteroClusterEnv(workers=4, workload=workload, obs_schema=v, scenario="throttle") for v in (3, 4)
    }
    assert isinstance(envs[4].encoder, CostAwareEncoder)
    spec = envs[4].backend.spec
    assert spec.compute_curve_s.shape == (4, 9)
    obs = {v: e.reset(seed=4)[0] for v, e in envs.items()}
    rng = np.random.default_rng(0)
    for _ in range(6):
        rows3 = OBS_SCHEMA_V3.split_centralised(obs[3], 4)
        rows4 = OBS_SCHEMA_V4.split_centralised(obs[4], 4)
        np.testing.assert_array_equal(rows4[:, :fw3], rows3[:, :fw3])  # schema 3's worker features
        np.testing.assert_array_equal(rows4[:, fw3 + 1 :], rows3[:, fw3:])  # and its globals, untouched
        b = envs[4].last_report.local_batch
        for i in range(4):
            e = _reference_elasticity(spec.compute_curve_s[i], spec.min_batch[i], spec.max_batch[i], b[i])
            assert rows4[i, fw3] == pytest.approx(_scaled(e, 0.0, 2.0), abs=1e-6)
        action = rng.integers(0, envs[4].action_space.nvec)
        obs = {v: e.step(action)[0] for v, e in envs.items()}


def test_the_simulators_curve_is_its_fault_free_compute_model():
    env = HeteroClusterEnv(workers=8, scenario="throttle")
    spec, sim = env.backend.spec, env.backend.sim
    grid = compute_curve_batches(spec.min_batch, spec.max_batch, 9)
    env.reset(seed=0)
    for j in range(9):  # at reset the throttle has not started: the live model at every grid column
        np.testing.assert_allclose(spec.compute_curve_s[:, j], sim.compute_time_s(grid[:, j]), rtol=1e-12)


def test_elasticity_reads_proportional_free_and_knee_costs():
    spec = HeteroClusterEnv(workers=3).backend.spec
    lo, hi = spec.min_batch.astype(float), spec.max_batch.astype(float)
    grid = compute_curve_batches(lo, hi, 9)
    proportional = dataclasses.replace(spec, compute_curve_s=1e-3 * grid)
    free = dataclasses.replace(spec, compute_curve_s=np.full_like(grid, 0.05))
    quadratic = dataclasses.replace(spec, compute_curve_s=1e-6 * grid**2)
    for b in (lo, np.sqrt(lo * hi), hi):
        np.testing.assert_allclose(compute_elasticity(proportional, b), 1.0, atol=1e-9)
        np.testing.assert_allclose(compute_elasticity(free, b), 0.0, atol=1e-9)
        np.testing.assert_allclose(compute_elasticity(quadratic, b), 2.0, atol=1e-9)
    # the fitted GPUs' launch floors: almost free at small batches, near proportional at large ones
    e_small, e_large = compute_elasticity(spec, spec.min_batch), compute_elasticity(spec, spec.max_batch)
    assert np.all(e_small < e_large) and np.all(e_large > 0.8)
    one = dataclasses.replace(spec, min_batch=lo.astype(np.int64), max_batch=lo.astype(np.int64),
                              initial_batch=lo.astype(np.int64), compute_curve_s=np.full_like(grid, 0.1))  # fmt: skip
    np.testing.assert_array_equal(compute_elasticity(one, lo), 0.0)


def test_a_spec_without_a_curve_is_refused_naming_the_field():
    spec = dataclasses.replace(HeteroClusterEnv(workers=2).backend.spec, compute_curve_s=None)
    with pytest.raises(ValueError, match=r"BackendSpec\.compute_curve_s is None"):
        compute_elasticity(spec, spec.initial_batch)
    with pytest.raises(
        ValueError, match=r"schema 4 reads BackendSpec\.compute_curve_s.*calibrate\.quick=true"
    ):
        DecisionStep.for_options(spec, "scale", {"obs_schema": "4"})  # the drop-in: before any interval
    DecisionStep.for_options(spec, "scale", {"obs_schema": "3"})  # schema 3 reads no curve
    for bad, message in (
        (np.ones((3, 9)), r"compute_curve_s must have shape \(2, G\) with 2 <= G <= 64, got \(3, 9\)"),
        (np.ones((2, 1)), r"compute_curve_s must have shape \(2, G\)"),
        (np.zeros((2, 9)), r"compute_curve_s must be finite and > 0"),
        (np.full((2, 9), np.nan), r"compute_curve_s must be finite and > 0"),
    ):
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(spec, compute_curve_s=bad)


def test_an_env_takes_a_curve_measured_after_it_was_built():
    """As experiments.deploy does: the env is built, the quick calibration then measures the curve and
    the backend carries it; the env's next reset encodes with it (and refused to encode before)."""
    env = HeteroClusterEnv(workers=2, obs_schema=4)
    with_curve = env.backend.spec
    env.backend.spec = dataclasses.replace(with_curve, compute_curve_s=None)
    with pytest.raises(ValueError, match=r"schema 4 reads BackendSpec\.compute_curve_s"):
        env.reset(seed=0)
    env.backend.spec = with_curve
    obs, _ = env.reset(seed=0)
    assert env.decision.spec is with_curve and obs.shape == (OBS_SCHEMA_V4.centralised_dim(2),)


def test_real_ranks_take_their_curve_from_a_calibrated_profile():
    from adapters.ddp_backend import DDPBackend

    profile = load_profile(LM_REFIT)
    params = profile.compute_params("cpu", profile.workload.app)
    backend = DDPBackend(workers=2, dataset="pystdlib", model="transformer", min_batch=4, max_batch=256,
                         base_batch=16, initial_batch=8, compute_profile=LM_REFIT)  # fmt: skip
    try:  # no rank starts before reset
        spec = backend.spec
        grid = compute_curve_batches(spec.min_batch, spec.max_batch, 9)
        np.testing.assert_allclose(
            spec.compute_curve_s, ComputeModel(params).compute_time_s(grid), rtol=1e-12
        )
        np.testing.assert_allclose(
            spec.compute_curve_s,
            profile_compute_curve(profile, spec.gpu_types, spec.min_batch, spec.max_batch),
        )
        e = compute_elasticity(spec, spec.initial_batch)
        assert np.all((e > 0.8) & (e < 1.1))  # a CPU rank: a step costs nearly in proportion to its batch
        assert isinstance(make_encoder("4", spec), CostAwareEncoder)
    finally:
        backend.close()


def test_a_campaigns_schema4_runs_read_the_profile_its_simulated_side_uses():
    """experiments.fidelity: the real ranks of a schema-4 bundle carry the campaign profile's curve
    (the refit measured right before, in a deployment campaign); other controllers' ranks carry none."""
    from adapters.sim2real import RealEnvs, real_profile
    from sim.faults import Scenario

    profile, real_config = real_profile(LM_REFIT)
    reals = RealEnvs(real_config, Scenario("none", ()), 60.0, compute_profile=LM_REFIT)
    try:
        env4 = reals.env(8, "scale", 20, "time", {"obs_schema": "4", "action_set": [0.5, 1.0, 2.0]})
        env3 = reals.env(8, "scale", 20, "time", {"obs_schema": "3", "action_set": [0.5, 1.0, 2.0]})
        assert env4.backend is not env3.backend and env3.backend.spec.compute_curve_s is None
        assert env4.backend.config.compute_profile == LM_REFIT
        expected = profile_compute_curve(
            profile, ("cpu", "cpu"), env4.backend.spec.min_batch, env4.backend.spec.max_batch
        )
        np.testing.assert_allclose(env4.backend.spec.compute_curve_s, expected)
    finally:
        reals.close()
