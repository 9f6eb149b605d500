"""The guards' logic (sim.guards): settings checks, the learning-rate cap and ramp, the watchdog,
and the guard's snapshot / rollback / cool-down bookkeeping. Real ranks: tests/adapters/test_guards_real.py."""

from __future__ import annotations

import math
import re

import pytest

from sim.guards import Guard, GuardConfig, LRRamp, Watchdog, capped_lr_gain


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("mode", "on", "one of ['off', 'watch', 'act']"),
        ("max_lr_gain", 0.5, ">= 1"),
        ("max_lr_gain", math.inf, "a finite number"),
        ("lr_ramp_iters", -1, "an integer >= 0"),
        ("lr_ramp_iters", 2.5, "an integer >= 0"),
        ("lr_gain_warmup", -1, "an integer >= 0"),
        ("lr_gain_warmup", True, "an integer >= 0"),
        ("quality_drop", 0.0, "(0, 1]"),
        ("quality_drop", 1.5, "(0, 1]"),
        ("loss_factor", 1.0, "> 1"),
        ("patience", 0, "an integer >= 1"),
        ("cooldown", -2, "an integer >= 0"),
        ("max_rollbacks", 0, "an integer >= 1"),
        ("fallback", "", "'hold' or a controller name"),
        ("snapshot_tolerance", 0.5, "[0, quality_drop=0.15]"),
        ("lr_backoff", 0.0, "(0, 1]"),
        ("best_window", 0, "an integer >= 1"),
    ],
)
def test_bad_settings_name_the_field_and_the_range(field, value, allowed):
    with pytest.raises(ValueError, match=rf"guards\.{field}=.*outside its range: {re.escape(allowed)}"):
        GuardConfig(**{field: value})


def test_config_from_mappings_modes_and_none():
    assert GuardConfig.from_any(None) == GuardConfig()
    assert GuardConfig.from_any("watch").mode == "watch"
    assert GuardConfig.from_any({"patience": 3}).patience == 3
    with pytest.raises(ValueError, match=r"unknown guards settings \['patince'\]"):
        GuardConfig.from_any({"patince": 3})


def test_the_cap_applies_only_when_acting():
    assert capped_lr_gain(5.0, 2.0) == 2.0
    assert capped_lr_gain(1.5, 2.0) == 1.5
    assert capped_lr_gain(5.0, None) == 5.0
    assert GuardConfig().lr_gain(8.0) == 2.0
    assert GuardConfig(mode="watch").lr_gain(8.0) == 8.0
    assert GuardConfig(mode="off").ramp_iters() == 0
    assert GuardConfig().gain_warmup() == 1
    assert GuardConfig(mode="watch").gain_warmup() == 0  # watching changes nothing


def test_the_ramp_rises_linearly_restarts_from_where_it_is_and_falls_at_once():
    ramp = LRRamp(4)
    ramp.set_target(0.1)  # the first rate is taken at once
    assert ramp.steps(2) == [0.1, 0.1]
    ramp.set_target(0.5)
    assert ramp.steps(2) == pytest.approx([0.2, 0.3])
    ramp.set_target(0.7)  # mid-ramp: from 0.3 up over 4 iterations
    assert ramp.steps(5) == pytest.approx([0.4, 0.5, 0.6, 0.7, 0.7])
    ramp.set_target(0.5)
    ramp.set_target(0.9)
    ramp.set_target(0.2)  # mid-ramp down: at once
    assert ramp.steps(2) == [0.2, 0.2]
    drift = LRRamp(4)
    drift.set_target(0.1, 64)
    drift.set_target(0.4, 256)  # the batch grew: a ramp
    assert drift.steps(2) == pytest.approx([0.175, 0.25])
    drift.set_target(0.5, 256)  # the rule's drift at the same batch, mid-ramp: the same ramp, a new end
    assert drift.steps(3) == pytest.approx([0.4, 0.5, 0.5])
    drift.set_target(0.6, 256)  # drift after the ramp: at once, not a ramp restarted every interval
    assert drift.steps(1) == [0.6]
    instant = LRRamp(0)
    instant.set_target(0.1)
    instant.set_target(0.7)
    assert instant.steps(2) == [0.7, 0.7]
    with pytest.raises(ValueError, match="lr ramp iters"):
        LRRamp(-1)


def test_the_watchdog_fires_after_patience_bad_intervals_and_at_once_on_nan():
    dog = Watchdog(GuardConfig(patience=2, quality_drop=0.2, loss_factor=3.0, best_window=1))
    assert dog.check(0.5, 1.0).good
    assert dog.check(0.7, 0.8).good
    first = dog.check(0.4, 0.9)  # 0.3 below the best 0.7
    assert not first.fire and "fell 0.3000 below its best 0.7000" in first.reason
    assert dog.check(0.65, 0.8).good  # recovered: the streak starts again
    assert not dog.check(0.45, 0.8).fire
    second = dog.check(0.45, 0.8)
    assert second.fire and "2 intervals in a row" in second.reason
    loss = Watchdog(GuardConfig(patience=1, loss_factor=2.0, best_window=1))
    loss.check(0.5, 0.5)
    assert "rose past 2.0 x its lowest" in loss.check(0.5, 1.2).reason
    assert Watchdog(GuardConfig()).check(0.5, math.nan).fire


def test_a_bad_interval_moves_neither_the_best_nor_the_snapshot():
    guard = Guard(GuardConfig(patience=2, quality_drop=0.2, cooldown=2, max_rollbacks=2, best_window=1))
    assert guard.observe(0, 1.0, 0.6, 1.0, [16, 16]) == "snapshot"
    assert guard.observe(1, 2.0, 0.3, 1.0, [64, 64]) == ""  # bad: no snapshot of it
    assert guard.held_batches == (16, 16) and guard.snapshot_interval == 0
    assert guard.observe(2, 3.0, 0.1, 2.0, [64, 64]) == "rollback"
    event = guard.rolled_back(3.5)
    assert event.snapshot_interval == 0 and event.snapshot_batches == (16, 16)
    assert event.time_lost_s == pytest.approx(2.5) and event.action == "rolled back"
    assert "rolled back; back to the snapshot after interval 0 at batches [16, 16]" in event.describe()
    # the cool-down: the fallback decides twice, then the policy again
    assert [guard.fallback_decides() for _ in range(3)] == [True, True, False]
    assert guard.watchdog.best_quality == 0.6  # the snapshot's watchdog state
    guard.observe(3, 4.0, 0.62, 1.0, [16, 16])
    guard.observe(4, 5.0, 0.1, 9.0, [64, 64])
    assert guard.observe(5, 6.0, 0.1, 9.0, [64, 64]) == "rollback"
    assert "the fallback keeps control to the end" in guard.rolled_back(6.1).action
    assert all(guard.fallback_decides() for _ in range(10))  # max_rollbacks reached
    summary = guard.summary()
    assert summary["guard_rollbacks"] == 2 and summary["guard_fallback_intervals"] == 12
    assert summary["guard_time_lost_s"] == pytest.approx(2.5 + 2.1)
    assert guard.lr_scale == 0.25  # halved by each rollback


def test_watching_records_what_it_would_do_and_changes_nothing():
    guard = Guard(GuardConfig(mode="watch", best_window=1))
    assert guard.observe(0, 1.0, 0.6, 1.0, [16, 16]) == ""
    verdicts = [guard.observe(i, float(i), 0.1, 5.0, [64, 64]) for i in range(1, 4)]
    assert verdicts == ["", "", ""]
    assert [e.action for e in guard.events] == ["would roll back"]
    assert not guard.cooling_down and not guard.fallback_decides()
    off = Guard("off")
    assert off.observe(0, 1.0, math.nan, math.nan, [1]) == "" and not off.events


def test_a_collapse_before_any_healthy_interval_has_nothing_to_roll_back_to():
    guard = Guard()
    assert guard.observe(0, 1.0, 0.1, 2.3, [16], diverged="the training loss became nan") == ""
    assert guard.events[0].action == "no snapshot to roll back to"
    with pytest.raises(RuntimeError, match="without a rollback"):
        guard.rolled_back(1.0)


def test_state_round_trips_for_a_resumed_run():
    guard = Guard(GuardConfig(patience=1, cooldown=3, best_window=1))
    guard.observe(0, 1.0, 0.6, 1.0, [16, 16])
    guard.observe(1, 2.0, 0.1, 9.0, [64, 64])
    guard.rolled_back(2.5)
    again = Guard(GuardConfig(patience=1, cooldown=3, best_window=1))
    again.load_state_dict(guard.state_dict())
    assert again.events == guard.events and again.rollbacks == 1 and again.cooldown_left == 3
    assert again.held_batches == (16, 16) and again.snapshot_interval is None


def test_the_best_is_a_level_held_not_a_one_interval_peak():
    # an early run of the deploy app's MNIST job: a peak at 0.51, then 0.09, then on its way up
    early = [0.10, 0.13, 0.51, 0.09, 0.08, 0.65, 0.71]
    held = Watchdog(GuardConfig(patience=2, quality_drop=0.15))  # best_window 2, the default
    assert not any(held.check(q, 2.3 - q).fire for q in early)
    peak = Watchdog(GuardConfig(patience=2, quality_drop=0.15, best_window=1))
    assert any(peak.check(q, 2.3 - q).fire for q in early)  # the peak alone would have fired it
    # a collapse from a level the run held still fires within two intervals
    collapse = Watchdog(GuardConfig(patience=2, quality_drop=0.15))
    fired = [collapse.check(q, 1.0).fire for q in [0.47, 0.69, 0.60, 0.09, 0.09]]
    assert fired == [False, False, False, False, True]
