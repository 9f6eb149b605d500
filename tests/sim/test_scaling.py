"""sim.scaling: statistical efficiency, AdaScale's gain, the learning-rate rules, the midpoint step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.scaling import (
    LR_RULES,
    adascale_gain,
    advance,
    estimated_adascale_gain,
    lr_gain,
    lr_stability,
    progress_gain,
    statistical_efficiency,
)


def test_statistical_efficiency_values():
    assert statistical_efficiency(100.0, 32, 32) == 1.0
    assert statistical_efficiency(100.0, 232, 32) == pytest.approx(132.0 / 332.0)
    assert statistical_efficiency(0.0, 64, 32) == 0.5
    np.testing.assert_allclose(statistical_efficiency(np.array([0.0, 32.0]), 64, 32), [0.5, 64 / 96])


def test_adascale_gain_values_and_range():
    assert adascale_gain(256, 32, 200.0) == pytest.approx(8 * 232 / 456)
    assert adascale_gain(256, 32, 0.0) == 1.0  # no noise: a big batch is worth one base step
    assert adascale_gain(256, 32, 1e12) == pytest.approx(8.0)  # all noise: worth M / M0 steps
    assert adascale_gain(32, 32, 5.0) == 1.0
    # the gain is exactly (M / M0) * E(M), in that operation order
    assert adascale_gain(1000, 32, 77.7) == 1000 / 32 * statistical_efficiency(77.7, 1000, 32)


def test_estimated_gain_before_and_after_an_estimate():
    assert estimated_adascale_gain(256, 32, None) == 1.0
    assert estimated_adascale_gain(256, 32, -5.0) == adascale_gain(256, 32, 0.0)
    assert estimated_adascale_gain(256, 32, 200.0) == adascale_gain(256, 32, 200.0)


def test_progress_gain_per_rule():
    m, m0, b = 512, 32, 300.0
    r_ada = adascale_gain(m, m0, b)
    assert progress_gain("adascale", m, m0, b, 0.0) == r_ada
    assert progress_gain("linear", m, m0, b, 0.0) == r_ada
    assert progress_gain("sqrt", m, m0, b, 0.0) == min(4.0, r_ada)
    assert progress_gain("none", m, m0, b, 0.0) == 1.0
    assert progress_gain("none", m, m0, b, 0.5) == min(4.0, r_ada)
    assert progress_gain("sqrt", m, m0, 1e9, 0.0) == pytest.approx(4.0)


def test_lr_gain_per_rule():
    assert LR_RULES == ("adascale", "linear", "sqrt", "none")
    assert lr_gain("linear", 256, 32, None) == 8.0
    assert lr_gain("sqrt", 128, 32, None) == 2.0
    assert lr_gain("none", 512, 32, 100.0) == 1.0
    assert lr_gain("adascale", 256, 32, None) == 1.0
    assert lr_gain("adascale", 256, 32, 200.0) == adascale_gain(256, 32, 200.0)
    with pytest.raises(ValueError, match="lr_rule"):
        lr_gain("cubic", 64, 32, None)
    with pytest.raises(ValueError, match="positive"):
        lr_gain("linear", 0, 32, None)


def test_advance_is_the_midpoint_rule():
    calls = []

    def per_step(batch, p):
        calls.append((batch, p))
        return 1.0 + p / 100.0

    dp = advance(per_step, 64, 10.0, 20)
    r1 = 1.1
    assert calls == [(64, 10.0), (64, 10.0 + 0.5 * 20 * r1)]
    assert dp == 20 * (1.0 + (10.0 + 0.5 * 20 * r1) / 100.0)
    # exact for a constant rate
    assert advance(lambda b, p: 2.5, 64, 0.0, 8) == 20.0
    assert math.isclose(advance(lambda b, p: 1.0, 64, 3.0, 0), 0.0)


def test_lr_stability_limits_the_rules_that_raise_the_learning_rate():
    assert lr_stability(50.0, None) == 1.0  # no limit
    assert lr_stability(1.5, 2.0, 1.0) == 1.0
    assert lr_stability(8.0, 2.0, 1.0) == pytest.approx(0.25)
    assert lr_stability(8.0, 2.0, 2.0) == pytest.approx(1 / 16)
    np.testing.assert_allclose(lr_stability(np.array([1.0, 4.0]), 2.0, 1.0), [1.0, 0.5])
    m, m0, b = 512.0, 32.0, 200.0
    r_ada = adascale_gain(m, m0, b)
    # AdaScale's learning rate is r_ada times the base one: with q = 1 its gain saturates at the limit
    assert progress_gain("adascale", m, m0, b, 0.0, 2.0, 1.0) == pytest.approx(2.0)
    assert progress_gain("adascale", m, m0, b, 0.0, 2.0, 2.0) == pytest.approx(r_ada * (2.0 / r_ada) ** 2)
    assert progress_gain("linear", m, m0, b, 0.0, 2.0, 1.0) == pytest.approx(r_ada * 2.0 / 16.0)
    assert progress_gain("sqrt", m, m0, b, 0.0, 2.0, 1.0) == pytest.approx(min(4.0, r_ada) * 2.0 / 4.0)
    # `none` never raises the learning rate: no limit applies, and it can beat a limited AdaScale
    none = progress_gain("none", m, m0, b, 0.5, 2.0, 3.0)
    assert none == progress_gain("none", m, m0, b, 0.5) > progress_gain("adascale", m, m0, b, 0.5, 2.0, 3.0)
    # below the limit nothing changes
    assert progress_gain("adascale", 40.0, m0, b, 0.0, 2.0, 1.0) == adascale_gain(40.0, m0, b)
