"""The convergence model's batch dependence refitted to the intervals runs took to the target
(sim.fitting.schedules.fit_intervals_to_target)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from support import ROOT

from sim.convergence import ConvergenceModel
from sim.fitting.schedules import (
    HOLD_INTERVALS,
    ScheduleRun,
    crossing,
    fit_intervals_to_target,
    interval_residuals,
    intervals_to_target_many,
    model_intervals_to_target,
    replay,
    replay_many,
    with_target_vector,
)
from sim.profile import load_profile

LM = ROOT / "results" / "lm" / "profile_2"
TARGET = 0.77
#: Global batches of runs as the LM campaigns made them: static, a jump early, a decrease.
SCHEDULES = {
    "static-16": [16] * 30,
    "static-64": [64] * 30,
    "jump": [16, 24, 72, 30, 30, 30] + [18] * 24,
    "down": [128, 128, 64] + [16] * 27,
}


def _params():
    prof = load_profile(LM)
    return prof.convergence_params(prof.workload.convergence)


def _runs(params, k=20, noise=0.0, seed=0):
    """Runs of SCHEDULES under ``params``, cut at the first interval at the target (as a campaign's)."""
    model, rng, out = ConvergenceModel(params, "adascale"), np.random.default_rng(seed), []
    for name, gb in SCHEDULES.items():
        acc = replay(model, ScheduleRun(name, "adascale", 0, k, np.array(gb, float), np.zeros(len(gb))))
        acc = acc + rng.normal(0.0, noise, len(acc))
        end = int(np.flatnonzero(acc >= TARGET)[0]) + 1
        out.append(ScheduleRun(name, "adascale", 0, k, np.array(gb[:end], float), acc[:end]))
    return out


def test_crossing_interpolates_between_interval_ends():
    assert crossing(np.array([0.5, 0.6, 0.8]), 0.7) == pytest.approx(2.5)
    assert crossing(np.array([0.75, 0.8]), 0.7) == 1.0
    assert math.isnan(crossing(np.array([0.5, 0.6]), 0.7))


def test_the_model_count_is_the_replay_crossing_and_holds_the_last_batch():
    params = _params()
    model = ConvergenceModel(params, "adascale")
    run = ScheduleRun("x", "adascale", 0, 20, np.array([16.0, 64.0]), np.zeros(2))  # ends far from the target
    held = np.array([16.0] + [64.0] * (1 + HOLD_INTERVALS))
    expect = crossing(replay(model, ScheduleRun("x", "adascale", 0, 20, held, np.zeros(len(held)))), TARGET)
    assert 2 < model_intervals_to_target(model, run, TARGET) == pytest.approx(expect)
    assert model_intervals_to_target(model, run, 0.99) == math.inf  # above the ceiling


@pytest.mark.parametrize("split", [True, False])
def test_the_batched_replay_is_the_replay_run_by_run(split):
    params = _params() if split else replace(_params(), progress_noise_factor=1.0)
    model = ConvergenceModel(params, "adascale")
    model.max_gain = 2.0
    assert model.split_noise is split
    runs = [ScheduleRun(n, "adascale", 0, 20, np.array(gb[: 8 + i], float), np.zeros(8 + i))
            for i, (n, gb) in enumerate(SCHEDULES.items())]  # fmt: skip
    many = intervals_to_target_many(model, runs, TARGET)
    one = [model_intervals_to_target(model, r, TARGET) for r in runs]
    np.testing.assert_allclose(many, one, rtol=1e-9)
    gb = np.array([r.global_batch[:8] for r in runs])
    np.testing.assert_allclose(
        replay_many(model, gb, 20), [replay(model, replace(r, global_batch=r.global_batch[:8],
                                                          val_accuracy=np.zeros(8))) for r in runs],
        rtol=1e-12)  # fmt: skip
    assert intervals_to_target_many(model, runs, 0.99).tolist() == [math.inf] * len(runs)


def test_the_fit_recovers_a_known_batch_dependence_from_runs_that_change_batch():
    params = _params()
    # the stored profile as static curves fitted it: a large noise factor, a large stretch, a short memory
    truth = with_target_vector(params, [1.1, 0.1, np.log(80.0), np.log(2.0)])
    runs = _runs(truth)
    fit = fit_intervals_to_target(params, runs, TARGET, max_gain=2.0, grid=False)  # the profile's start
    assert fit.rms_after < 0.01 < fit.rms_before
    res = interval_residuals(fit.params, runs, TARGET, max_gain=2.0)
    assert np.sqrt(np.mean(res**2)) == pytest.approx(fit.rms_after)
    # an early large batch is what tells the two explanations apart: the profile's short memory
    # forgets its stretch and counts its progress in full, so it sees the run that starts large and
    # drops far sooner at the target than it is; the refit does not
    down = [r.name for r in runs].index("down")
    before = interval_residuals(params, runs, TARGET, max_gain=2.0)
    assert before[down] < -0.2 and abs(res[down]) < 0.02
    # only the four parameters move
    assert fit.params.log_grad_var == params.log_grad_var and fit.params.acc_ceiling == params.acc_ceiling


def test_the_fit_refuses_runs_that_never_reach_the_target():
    params = _params()
    runs = _runs(params)
    short = replace(runs[0], global_batch=runs[0].global_batch[:2], val_accuracy=runs[0].val_accuracy[:2])
    with pytest.raises(ValueError, match="never reaches the target"):
        interval_residuals(params, [short], TARGET)
    with pytest.raises(ValueError, match="at least one run"):
        fit_intervals_to_target(params, [], TARGET)
