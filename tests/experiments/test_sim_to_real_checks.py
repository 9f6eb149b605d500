"""The simulator's prediction of every real interval (experiments.sim_to_real.checks.interval_errors)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dynamix_gym.measurement.compare import IterationPredictor
from experiments.sim_to_real.checks import interval_errors
from tests.dynamix_gym.measurement.test_compare import SCENARIO, _profile


def _row(end_s: float, length_s: float, iteration_s: float) -> dict:
    return {"controller": "c", "seed": 0, "step": 1, "wall_time_s": end_s, "interval_time_s": length_s,
            "w0_batch": 64, "w1_batch": 64, "w0_iteration_time_s": iteration_s,
            "w1_iteration_time_s": iteration_s}  # fmt: skip


def test_an_interval_across_a_throttle_edge_is_predicted_piece_by_piece(tmp_path):
    profile = _profile(tmp_path / "p", host_s=0.0)
    pred = IterationPredictor(profile)
    b = np.array([64.0, 64.0])
    slow, fast = pred.iteration_time_s(b, (0.2, 1.0)), pred.iteration_time_s(b, (0.4, 1.0))
    # the window runs 2-5 s: [0, 1] before it, [1, 3] opens inside it, [4, 6] closes inside it
    timelines = pd.DataFrame([_row(1.0, 1.0, 0.1), _row(3.0, 2.0, 0.1), _row(6.0, 2.0, 0.1)])
    out = interval_errors(timelines, profile, SCENARIO, 2)
    assert out["predicted_s"].iloc[0] == pytest.approx(fast)
    # 1 s at the fast pace and 1 s at the slow one: total time over the iterations they hold
    assert out["predicted_s"].iloc[1] == pytest.approx(2.0 / (1.0 / fast + 1.0 / slow))
    assert out["predicted_s"].iloc[2] == pytest.approx(2.0 / (1.0 / slow + 1.0 / fast))
    assert fast < out["predicted_s"].iloc[1] < slow
    assert out["ape"].iloc[0] == pytest.approx(abs(fast / 0.1 - 1.0))
