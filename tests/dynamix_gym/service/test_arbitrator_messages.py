"""Wire conversion keeps every field; validation names the field and its range."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service.messages import (
    FieldError,
    check_register,
    report_from_proto,
    report_to_proto,
    spec_from_proto,
    spec_to_proto,
)
from sim.protocol import WORKER_FIELDS


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
    for name in ("min_batch", "max_batch", "initial_batch"):
        np.testing.assert_array_equal(getattr(back, name), getattr(spec, name))
    assert back.time_budget_s == spec.time_budget_s


def test_simulated_reports_pass_and_round_trip(reports):
    spec, rs = reports
    for r in rs:
        back = report_from_proto(pb.IntervalReport.FromString(report_to_proto(r).SerializeToString()), spec)
        for name in WORKER_FIELDS:
            np.testing.assert_array_equal(getattr(back, name), getattr(r, name), err_msg=name)
        for name in (
            "iterations",
            "interval_time_s",
            "wall_time_s",
            "global_batch",
            "val_accuracy",
            "samples",
        ):
            assert getattr(back, name) == getattr(r, name)


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
    bad.schema_version = "0"
    with pytest.raises(
        FieldError, match="schema_version: the service encodes observation schemas \\['1', '2', '3'\\] \\(''"
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
