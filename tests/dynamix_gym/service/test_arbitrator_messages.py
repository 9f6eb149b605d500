"""Wire conversion keeps every field; validation names the field and its range."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import messages
from dynamix_gym.service.messages import (
    FieldError,
    check_register,
    range_table,
    report_from_proto,
    report_to_proto,
    spec_from_proto,
    spec_to_proto,
)
from sim.protocol import FIELD_DTYPES, SCALAR_FIELDS, WORKER_FIELDS, IntervalReport

#: The report's fields that stay with the backend: what the wire leaves out, and nothing else.
OFF_THE_WIRE = {"events", "truth"}


@pytest.fixture(scope="module")
def reports():
    env = HeteroClusterEnv(workers=6, scenario="mixed")
    _, info = env.reset(seed=3)
    out = [info["report"]]
    for _ in range(12):
        _obs, _, term, trunc, info = env.step(env.action_space.sample())
        out.append(info["report"])
        if term or trunc:
            break
    return env.backend.spec, out


def test_spec_round_trip(reports):
    spec, _ = reports
    back = spec_from_proto(spec_to_proto(spec), spec.workload)
    names = (
        "gpu_types",
        "node_of_worker",
        "base_batch",
        "target_accuracy",
        "num_classes",
        "workload",
        "lr_rule",
    )
    for name in names:
        assert getattr(back, name) == getattr(spec, name)
    none = dataclasses.replace(spec, lr_rule="none")
    assert spec_from_proto(spec_to_proto(none), "w").lr_rule == "none"
    for name in ("min_batch", "max_batch", "initial_batch", "compute_curve_s"):
        np.testing.assert_array_equal(getattr(back, name), getattr(spec, name))
    assert back.compute_curve_s.shape == (6, 9)
    bare = dataclasses.replace(spec, compute_curve_s=None)  # a client from before the field: no curve
    assert spec_from_proto(spec_to_proto(bare), "w").compute_curve_s is None
    assert back.time_budget_s == spec.time_budget_s


def test_a_malformed_compute_curve_is_refused_naming_the_field(reports):
    spec, _ = reports
    s = spec_to_proto(spec)
    del s.compute_curve_s[-1]  # 53 values for 6 workers
    with pytest.raises(
        FieldError, match=r"spec\.compute_curve_s: needs 2 to 64 points per worker \(6 workers"
    ):
        spec_from_proto(s, "w")
    s = spec_to_proto(spec)
    del s.compute_curve_s[6:]  # one point per worker
    with pytest.raises(FieldError, match=r"spec\.compute_curve_s: needs 2 to 64 points"):
        spec_from_proto(s, "w")
    for bad in (-1.0, 0.0, float("nan"), float("inf"), 1e7):
        s = spec_to_proto(spec)
        s.compute_curve_s[4] = bad
        with pytest.raises(
            FieldError, match=r"spec\.compute_curve_s: must (lie in \[1e-09, 1e\+06\]|be finite)"
        ):
            spec_from_proto(s, "w")


def test_simulated_reports_pass_and_round_trip_whole(reports):
    """Every report comes back equal, field for field (``reconfig_time_s``, which the cost-aware
    split reads, included), except what stays with the backend by design."""
    spec, rs = reports
    for r in rs:
        back = report_from_proto(pb.IntervalReport.FromString(report_to_proto(r).SerializeToString()), spec)
        assert back == dataclasses.replace(r, events=(), truth=None)
    # A field left at the wire's default (0) in every report would hide a dropped field: none is.
    on_wire = [f.name for f in dataclasses.fields(IntervalReport) if f.name not in OFF_THE_WIRE]
    always_zero = [name for name in on_wire if not any(np.any(getattr(r, name)) for r in rs)]
    assert always_zero == [], f"the test reports never set {always_zero}: a dropped field would pass"


def test_the_wire_message_is_the_reports_metadata():
    """pb.IntervalReport holds exactly the report's fields (per-worker ones repeated) of their types."""
    proto_type = {np.int64: "TYPE_INT64", int: "TYPE_INT64", np.bool_: "TYPE_BOOL"}
    wire = pb.IntervalReport.DESCRIPTOR.fields
    names = [f.name for f in dataclasses.fields(IntervalReport)]
    assert [f.name for f in wire] == [n for n in names if n not in OFF_THE_WIRE]
    assert list(WORKER_FIELDS + SCALAR_FIELDS) == [f.name for f in wire]
    for f in wire:
        assert f.is_repeated == (f.name in WORKER_FIELDS), f.name
        want = proto_type.get(FIELD_DTYPES[f.name], "TYPE_DOUBLE")
        assert f.type == getattr(f, want), f"{f.name}: wire type {f.type}, the report's {want}"


def test_the_docstring_range_table_is_generated():
    assert range_table() in inspect.cleandoc(messages.__doc__)
    assert "| reconfig_time_s | no | [0, 1e+06] |" in range_table()
    assert "| wall_time_s |" not in inspect.getsource(messages)  # no copy kept by hand


def test_a_dropped_field_fails_the_round_trip(reports):
    """The whole-report comparison notices a field the wire lost."""
    spec, rs = reports
    msg = report_to_proto(rs[-1])
    msg.ClearField("reconfig_time_s")
    back = report_from_proto(msg, spec)
    assert rs[-1].reconfig_time_s > 0 and back != dataclasses.replace(rs[-1], events=(), truth=None)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("cpu_util", math.nan, "finite"),
        ("gpu_util", 1.5, "[0, 1]"),
        ("iteration_time_s", -1.0, "[0, 10000]"),
        ("grad_norm_var", math.inf, "finite"),
    ],
)
def test_bad_worker_values_are_refused_by_name(reports, field, value, words):
    spec, rs = reports
    msg = report_to_proto(rs[0])
    getattr(msg, field)[2] = value
    with pytest.raises(FieldError, match=rf"report\.{field}") as e:
        report_from_proto(msg, spec)
    assert words in str(e.value)


def test_wrong_sizes_and_scalars_are_refused(reports):
    spec, rs = reports
    msg = report_to_proto(rs[0])
    del msg.mem_util[-1]
    with pytest.raises(FieldError, match=r"report\.mem_util: needs one entry per registered worker \(6\)"):
        report_from_proto(msg, spec)
    msg = report_to_proto(rs[0])
    msg.val_accuracy = 7.0
    with pytest.raises(FieldError, match=r"report\.val_accuracy: must lie in \[0, 1\]"):
        report_from_proto(msg, spec)
    msg = report_to_proto(rs[0])
    msg.local_batch[0] = int(spec.max_batch[0]) + 1
    with pytest.raises(FieldError, match=r"report\.local_batch: worker 0 reports .* registered range"):
        report_from_proto(msg, spec)


def test_registration_checks(reports):
    spec, _ = reports
    ok = pb.RegisterRequest(job_id="a", schema_version="1", spec=spec_to_proto(spec), interval=50)
    check_register(ok)
    bad = pb.RegisterRequest()
    bad.CopyFrom(ok)
    bad.schema_version = ""  # no schema named: the served bundle's own
    check_register(bad)
    bad.schema_version = "0"
    with pytest.raises(
        FieldError,
        match="schema_version: the service encodes observation schemas \\['1', '2', '3', '4'\\] \\(''",
    ):
        check_register(bad)
    bad.CopyFrom(ok)
    bad.job_id = "a b/../c"
    with pytest.raises(FieldError, match="job_id"):
        check_register(bad)
    s = spec_to_proto(spec)
    s.min_batch[1] = int(s.max_batch[1]) + 1
    with pytest.raises(FieldError, match=r"spec\.min_batch"):
        spec_from_proto(s, "w")
    s = spec_to_proto(spec)
    s.lr_rule = "cubic"
    with pytest.raises(
        FieldError, match=r"spec\.lr_rule: must be one of \['adascale', 'linear', 'sqrt', 'none'\]"
    ):
        spec_from_proto(s, "w")
    s.lr_rule = ""  # a client from before the field: AdaScale, the default
    assert spec_from_proto(s, "w").lr_rule == "adascale"
    s = spec_to_proto(spec)
    del s.gpu_types[:]
    with pytest.raises(FieldError, match=r"spec.gpu_types: a job has 1 to 1024 workers, got 0"):
        spec_from_proto(s, "w")
