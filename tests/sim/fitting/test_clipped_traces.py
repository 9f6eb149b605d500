"""Convergence traces as a Pollux / AdaptDL-style measurement writes them: the squared-gradient
estimate is clipped at 0, so late epochs carry ``grad_sqr = 0``. They are read, the noise-scale fit
leaves those rows out and says which, and the same rows removed by hand (holes in the epochs the
runs share) fit too instead of failing inside scipy."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from byo_data import M0, WORKLOAD_YAML, calibrate_config, clipped_traces_table, write_inputs

from experiments.calibrate import calibrate
from sim.fitting.convergence import epoch_bins, fit_app, fit_grad_stats
from sim.specs_io import workload_from_dict
from sim.traces_table import app_spec, read_traces


@pytest.fixture(scope="module")
def workload():
    doc = yaml.safe_load(WORKLOAD_YAML)
    return workload_from_dict(
        {**doc, "app": doc["name"], "convergence": doc["name"], "app_params_millions": 10.3, "num_classes": 2}
    )


def _read(df: pd.DataFrame, tmp_path, workload, name: str = "traces.csv"):
    df.to_csv(tmp_path / name, index=False)
    return read_traces(tmp_path / name, workload)


def _fit(traces, workload):
    return fit_app(workload.convergence, traces, 0.1, app_spec(workload, traces))


def test_zero_grad_sqr_rows_are_read_and_left_out_of_the_noise_fit_by_name(tmp_path, workload):
    df = clipped_traces_table()
    zero = df[df["grad_sqr"] == 0]
    assert len(zero) >= 10 and zero["epoch"].min() > 15  # late epochs, scattered over the runs
    traces = _read(df, tmp_path, workload)
    assert sum(len(t.epoch) for t in traces) == len(df)  # every row read: the accuracy fit uses them
    fit = _fit(traces, workload)
    assert sorted(fit.grad.left_out) == sorted(zip(zero["global_batch"], zero["epoch"], strict=True))
    assert np.all(np.isfinite(fit.params.log_grad_var)) and np.all(np.isfinite(fit.params.log_grad_sqr))
    assert 0.88 < fit.params.acc_ceiling < 0.92  # generated: 1 - WER tends to 0.90
    (note,) = [n for n in fit.notes if "grad_sqr = 0" in n]
    first = zero[zero["global_batch"] == zero["global_batch"].min()]
    assert note.startswith(f"{len(zero)} row(s) with grad_sqr = 0")
    assert f"{first['global_batch'].iloc[0]}: {', '.join(str(e) for e in first['epoch'])}" in note


def test_the_same_rows_removed_by_hand_give_the_same_noise_fit(tmp_path, workload):
    df = clipped_traces_table()
    with_zeros = _read(df, tmp_path, workload, "zeros.csv")
    by_hand = _read(df[df["grad_sqr"] > 0], tmp_path, workload, "by_hand.csv")
    # The runs now share epochs with holes: the shape whose knots PCHIP refused ("x must be strictly
    # increasing") before the knots were taken by position among the shared epochs.
    epochs, _ = epoch_bins(by_hand)
    assert not np.array_equal(epochs, np.arange(1, len(epochs) + 1))
    a, b = fit_grad_stats(with_zeros, M0), fit_grad_stats(by_hand, M0)
    assert b.left_out == () and len(a.left_out) > 0
    assert (a.progress_knots, a.log_grad_sqr, a.log_grad_var) == (
        b.progress_knots,
        b.log_grad_sqr,
        b.log_grad_var,
    )
    fit = _fit(by_hand, workload)  # the accuracy fit over the holes too
    assert np.all(np.diff(fit.params.progress_knots) > 0) and np.all(np.diff(fit.params.shape_x) > 0)


def test_runs_logged_every_other_epoch_fit(tmp_path, workload):
    df = clipped_traces_table()
    traces = _read(df[(df["epoch"] % 2 == 0) & (df["epoch"] <= 20)], tmp_path, workload)
    fit = _fit(traces, workload)
    assert len(fit.params.progress_knots) == 10 and np.all(np.diff(fit.params.progress_knots) > 0)


def test_too_few_measured_epochs_are_refused_naming_the_cause(tmp_path, workload):
    df = clipped_traces_table()
    df.loc[(df["global_batch"] == 64) & (df["epoch"] >= 2), "grad_sqr"] = 0.0
    traces = _read(df, tmp_path, workload)
    with pytest.raises(
        ValueError,
        match=r"grad_sqr: the runs at global batches \[32, 64, 128, 256\] share 1 epoch\(s\) with "
        r"grad_sqr > 0 after leaving out the \d+ row\(s\) with grad_sqr = 0 \(clipped estimates\)",
    ):
        fit_grad_stats(traces, M0)
    df["grad_sqr"] = 0.0
    with pytest.raises(ValueError, match=r"grad_sqr: every row of the runs .* is 0 \(clipped estimates\)"):
        fit_grad_stats(_read(df, tmp_path, workload), M0)


def test_a_negative_grad_sqr_is_still_refused_by_row(tmp_path, workload):
    df = clipped_traces_table()
    df.loc[5, "grad_sqr"] = -1e-3
    with pytest.raises(
        ValueError,
        match=r"grad_sqr in row 6 \(line 7\) of traces\.csv must be >= 0 \(0: an estimate clipped at zero",
    ):
        _read(df, tmp_path, workload)


def test_the_calibration_report_lists_the_rows_left_out(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    df = clipped_traces_table()
    df.to_csv(inputs["traces"], index=False)
    out = tmp_path / "profile"
    cfg = calibrate_config(inputs, out)
    calibrate(cfg)
    report = json.loads((out / "calibration.json").read_text())
    rows = report["convergence_traces"]["grad_sqr_zero_rows_left_out"]
    zero = df[df["grad_sqr"] == 0]
    assert sorted((r["global_batch"], r["epoch"]) for r in rows) == sorted(
        zip(zero["global_batch"], zero["epoch"], strict=True)
    )
    assert "left out of the noise-scale fit" in (out / "calibration.md").read_text()
