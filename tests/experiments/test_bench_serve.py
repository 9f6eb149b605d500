"""The load benchmark's accounting: latency placed against the learner's updates."""

from __future__ import annotations

import pytest

from experiments.bench_serve import _latency, _latency_by_update


def _jobs():
    # two jobs; decisions at t = 0..9 s, the slow ones (50 ms) at t = 3, 4, 5
    a = {"latency_s": [0.001, 0.001, 0.001, 0.05, 0.05], "sent_at": [0.0, 1.0, 2.0, 3.0, 4.0]}
    b = {"latency_s": [0.05, 0.002, 0.002, 0.002, 0.002], "sent_at": [5.0, 6.0, 7.0, 8.0, 9.0]}
    return [a, b]


def test_decisions_are_split_by_whether_an_update_was_running():
    split = _latency_by_update(_jobs(), [{"t_start": 3.0, "t": 5.0}])
    assert split["update_s"] == [2.0]
    assert split["during_updates"]["n"] == 3
    assert split["during_updates"]["max_ms"] == pytest.approx(50.0)
    assert split["outside_updates"]["n"] == 7
    assert split["outside_updates"]["max_ms"] == pytest.approx(2.0)
    assert _latency(_jobs())["n"] == 10


def test_no_timed_update_gives_no_split():
    assert _latency_by_update(_jobs(), []) == {}
    assert _latency_by_update(_jobs(), [{"t_start": None, "t": 5.0}]) == {}
