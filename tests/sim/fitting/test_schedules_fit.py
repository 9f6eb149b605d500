"""The convergence model fitted to batch-schedule runs (sim.fitting.schedules)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from support import ROOT

from dynamix_gym.controllers.schedule import AccuracyScheduleController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from sim.convergence import ConvergenceModel, convergence_params
from sim.fitting.schedules import (
    ERROR_FLOOR,
    ScheduleRun,
    fit_schedules,
    log_error_residuals,
    replay,
    rmse,
    with_vector,
)

PROFILE = ROOT / "results" / "fidelity" / "profile"
SCHEDULES = {
    "static-32": [{"from_accuracy": 0.0, "batches": 16}],
    "static-128": [{"from_accuracy": 0.0, "batches": 64}],
    "dec": [{"from_accuracy": 0.0, "batches": 128}, {"from_accuracy": 0.8, "batches": 16}],
    "inc": [{"from_accuracy": 0.0, "batches": 16}, {"from_accuracy": 0.85, "batches": 128}],
}


def _batches(phases, acc_of, n=40):
    """Global batches of a 2-worker schedule run driven by a noise-free accuracy function."""
    out, best = [], 0.0
    for i in range(n):
        phase = max(j for j, p in enumerate(phases) if p["from_accuracy"] <= best)
        out.append(2 * phases[phase]["batches"])
        best = max(best, acc_of(i, out))
    return np.array(out, dtype=float)


def test_replay_is_the_engines_noise_free_accuracy():
    env = HeteroClusterEnv(
        profile=str(PROFILE), action_mode="absolute", interval=20, scenario="static_hetero"
    )
    sim = env.unwrapped.backend.sim
    for phases in SCHEDULES.values():
        res = run_episode(env, AccuracyScheduleController(phases), seed=3, max_steps=30)
        run = ScheduleRun("x", sim.convergence.lr_rule, 3, 20,
                          np.array([r["global_batch"] for r in res.timeline], float),
                          np.array([r["true_val_accuracy"] for r in res.timeline], float))  # fmt: skip
        np.testing.assert_allclose(replay(sim.convergence, run), run.val_accuracy, rtol=0, atol=1e-12)


@pytest.mark.parametrize("regime", ["none", "adascale"])
def test_the_fit_recovers_known_schedule_parameters(regime):
    base = convergence_params("cifar10")
    # ceiling, shape scale, none exponent, gap, stretch, log memory, log lr limit, its exponent, log noise factor
    truth = with_vector(base, [0.9, 1.3, 0.3, 0.03, 0.4, np.log(200.0), np.log(3.0), 1.0, np.log(0.5)])
    model = ConvergenceModel(truth, regime)
    rng = np.random.default_rng(0)
    runs = []
    for name, phases in SCHEDULES.items():

        def acc_of(i, batches, name=name):
            r = ScheduleRun(name, regime, 0, 50, np.array(batches, float), np.zeros(len(batches)))
            return float(replay(model, r)[-1])

        gb = _batches(phases, acc_of)
        clean = replay(model, ScheduleRun(name, regime, 0, 50, gb, np.zeros(len(gb))))
        runs.append(ScheduleRun(name, regime, 0, 50, gb, clean + rng.normal(0, 0.003, len(gb))))
    fit = fit_schedules(replace(base, acc_ceiling=0.8), runs)
    assert fit.rmse_after < 0.005 < fit.rmse_before
    assert fit.params.acc_ceiling == pytest.approx(0.9, abs=0.01)
    assert rmse(fit.params, runs) == pytest.approx(fit.rmse_after)


def test_log_error_residuals_weigh_the_approach_to_the_plateau():
    base = convergence_params("cifar10")
    gb = np.full(30, 256.0)
    model = replay(ConvergenceModel(base, "none"), ScheduleRun("x", "none", 0, 50, gb, np.zeros(30)))
    run = ScheduleRun("x", "none", 0, 50, gb, model - 0.01)  # one point below the model everywhere
    res = log_error_residuals(base, [run])
    np.testing.assert_allclose(res, np.log(1 - model) - np.log(1 - model + 0.01))
    assert np.all(np.diff(model) > 0) and np.all(np.diff(np.abs(res)) > 0)  # higher up, larger
    assert ERROR_FLOOR < 1 - model.max()
