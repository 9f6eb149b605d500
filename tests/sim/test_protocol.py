"""The interval report is defined once: its field metadata names every measured field, and the
field lists, ranges and checks are read from it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sim.engine import Simulator
from sim.protocol import FIELD_DTYPES, FIELD_RANGES, SCALAR_FIELDS, WORKER_FIELDS, IntervalReport


@pytest.fixture(scope="module")
def report() -> IntervalReport:
    sim = Simulator(workload="cifar10", scenario="mixed", seed=0)
    sim.reset()
    sim.run_interval(sim.min_batch, 10)
    return sim.run_interval(np.minimum(sim.min_batch * 2, sim.max_batch), 10)  # a batch change


def test_every_field_but_events_and_truth_carries_metadata():
    names = [f.name for f in dataclasses.fields(IntervalReport)]
    assert [n for n in names if n not in ("events", "truth")] == list(WORKER_FIELDS + SCALAR_FIELDS)
    assert set(FIELD_DTYPES) == set(WORKER_FIELDS + SCALAR_FIELDS)
    # every numeric field has a range except the local batch (the spec's) and the alive flag
    assert set(WORKER_FIELDS + SCALAR_FIELDS) - set(FIELD_RANGES) == {"local_batch", "alive"}
    for low, high in FIELD_RANGES.values():
        assert 0 <= low < high


def test_simulated_reports_lie_in_their_ranges(report):
    report.validate()
    for name, (low, high) in FIELD_RANGES.items():
        v = np.asarray(getattr(report, name), dtype=np.float64)
        assert np.all((v >= low) & (v <= high)), (name, v)


@pytest.mark.parametrize(
    ("name", "value"),
    [("reconfig_time_s", -1.0), ("epoch", math.nan), ("samples", -5), ("wall_time_s", math.inf)],
)
def test_validate_checks_every_global_field_by_name(report, name, value):
    bad = dataclasses.replace(report, **{name: value})
    with pytest.raises(ValueError, match=rf"IntervalReport\.{name} must be finite and >= 0"):
        bad.validate()


def test_validate_checks_per_worker_shapes_and_signs(report):
    with pytest.raises(ValueError, match=r"IntervalReport\.cpu_util has shape \(2,\)"):
        dataclasses.replace(report, cpu_util=np.zeros(2)).validate()
    with pytest.raises(ValueError, match=r"IntervalReport\.batch_loss holds negative values"):
        dataclasses.replace(report, batch_loss=-report.batch_loss - 1.0).validate()
