"""The learning-rate response fit (experiments.fit_lr_response) and the job that reads it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.fit_lr_response import fit_response, iterations_to_target, response
from sim.elastic import fitted_lr_response, lr_progress_gain


def test_iterations_to_target_interpolates_the_first_crossing():
    curve = [(5, 0.5), (10, 0.8), (15, 0.95), (20, 0.85), (25, 0.99)]
    assert iterations_to_target(curve, 0.9) == pytest.approx(10 + (0.1 / 0.15) * 5)
    assert iterations_to_target(curve, 0.4) == 5.0
    assert math.isnan(iterations_to_target(curve, 0.995))


def test_the_response_is_read_against_the_rule_s_own_learning_rate():
    measured = response({0.8: [60.0, 40.0], 1.0: [50.0, 50.0], 1.25: [40.0, 40.0]})
    assert measured == {0.8: 1.0, 1.0: 1.0, 1.25: 1.25}
    with pytest.raises(ValueError, match=r"must include 1\.0"):
        response({0.8: [1.0]})


@pytest.mark.parametrize(("w", "a"), [(0.3, 1.0), (0.6, 0.5), (5.0, 0.3)])
def test_the_fit_recovers_a_known_response(w, a):
    ms = (0.8, 0.9, 1.0, 1.1, 1.25)
    truth = {m: lr_progress_gain(m, w, a) for m in ms}
    fit = fit_response(truth)
    assert fit["rms_log_error"] < 1e-3
    for m in ms:  # the response itself is identified (w and a trade off when the curve is flat)
        assert lr_progress_gain(m, fit["lr_tolerance"], fit["lr_exponent"]) == pytest.approx(
            truth[m], rel=2e-3
        )


def test_g_is_one_at_the_rule_s_rate_and_the_shipped_fit_is_read():
    assert lr_progress_gain(1.0, 0.25, 1.0) == 1.0 and lr_progress_gain(1.0, 9.0, 0.0) == 1.0
    w, a = fitted_lr_response()
    assert 1e-3 <= w <= 10.0 and 0.0 <= a <= 2.0
    assert np.isfinite(lr_progress_gain(1.25, w, a))


@pytest.mark.slow
def test_the_app_trains_real_ranks_and_writes_the_fit(tmp_path):
    """Two multipliers x one seed of real training through the Hydra app, to temporary files."""
    import json

    from support import run_app

    out, report = tmp_path / "lr.json", tmp_path / "lr.md"
    proc = run_app(
        "experiments.fit_lr_response",
        "multipliers=[1.0,1.25]",
        "seeds=[0]",
        "bootstrap=5",
        f"out={out}",
        f"report={report}",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["iterations_to_target"]) == {"1.0", "1.25"} and doc["measured_response"]["1.0"] == 1.0
    assert math.isfinite(doc["rms_log_error"]) and 0.0 <= doc["lr_exponent"] <= 2.0
    assert "lr_tolerance" in report.read_text()
    bad = run_app("experiments.fit_lr_response", "multipliers=[0.5,1.0]", f"out={out}", timeout=120)
    assert bad.returncode != 0 and "multipliers must lie in the elastic range" in bad.stderr
