"""Bring your own workload: one command fits compute, communication and convergence of an
application the project has never seen, from generated tables with a falling (WER-like) metric."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from byo_data import calibrate_config, write_inputs
from support import ROOT

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from experiments.calibrate import calibrate
from sim.convergence import convergence_params
from sim.datafiles import data_path
from sim.engine import Simulator
from sim.fitting.convergence import APP_SPECS, TRACES_FILE, fit_app
from sim.profile import load_profile
from sim.traces_table import app_spec, read_traces
from sim.workloads import WORKLOADS

TARGET_WER = 15.0


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    """The generated inputs and the profile one calibrate command makes of them."""
    root = tmp_path_factory.mktemp("byo")
    inputs = write_inputs(root / "in")
    out = root / "profile"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.calibrate", f"table={inputs['table']}", f"traces={inputs['traces']}",
         f"workload={inputs['workload']}", f"out_dir={out}", "name=asr_byo", f"hydra.run.dir={root / 'hydra'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return inputs, out


@pytest.mark.integration
def test_profile_holds_the_workload_and_all_three_fits(byo):
    _, out = byo
    prof = load_profile(out)
    wl = prof.workload
    assert (wl.name, wl.app, wl.convergence) == ("asr_byo", "asr_byo", "asr_byo")
    assert (wl.metric.name, wl.metric.higher_is_better, wl.metric.scale) == ("wer", False, 0.01)
    assert wl.target_accuracy == TARGET_WER and wl.target_quality == pytest.approx(0.85)
    assert {k for k in prof.compute} == {k for k in prof.comm} == {("T4", "asr_byo"), ("V100", "asr_byo")}
    conv = prof.convergence["asr_byo"]  # its own model, not CIFAR-10's
    assert conv.acc_chance == 0.0  # WER 100 % untrained
    assert conv.base_batch == 32
    assert 0.88 < conv.acc_ceiling < 0.92  # generated: 1 - WER at the smallest batch tends to 0.90


@pytest.mark.integration
def test_fit_report_gives_the_shipped_figures(byo):
    _, out = byo
    figures = json.loads((out / "calibration.json").read_text())["figures"]
    assert set(figures["step_time_loo_mdape"]) == {"T4", "V100"}
    assert max(figures["step_time_loo_mdape"].values()) < 0.05
    assert figures["metric"] == "wer"
    # Generated with 0.2 points of noise: the fit recovers it.
    assert 0.05 < figures["accuracy_rmse_metric"] < 0.5
    assert figures["accuracy_rmse"] == pytest.approx(figures["accuracy_rmse_metric"] * 0.01)
    taus = figures["epochs_to_target_kendall_tau"]
    assert "15" in taus and taus["15"] == pytest.approx(1.0)
    md = (out / "calibration.md").read_text()
    assert "## Fit figures" in md and "Kendall tau" in md and "Accuracy RMSE" in md
    assert "| target wer |" in md


@pytest.mark.integration
def test_a_short_episode_reaches_the_falling_target(byo):
    _, out = byo
    env = HeteroClusterEnv(profile=out, action_mode="absolute", interval=50, reward="time")
    spec = env.backend.spec
    assert spec.target_accuracy == pytest.approx(0.85) and spec.metric.name == "wer"
    env.reset(seed=0)
    terminated = truncated = False
    wers = []
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(np.full(spec.num_workers, 16, np.float32))
        wers.append(float(spec.metric.from_quality(info["report"].val_accuracy)))
    assert terminated and not truncated
    assert wers[-1] <= TARGET_WER < min(wers[:-1])  # reached_target exactly when WER fell to 15 %
    assert wers[0] > 50.0  # it started untrained-ish: the metric falls as training proceeds
    env.close()


@pytest.mark.integration
def test_reward_and_observation_see_a_falling_wer_as_rising_quality(byo):
    _, out = byo
    env = HeteroClusterEnv(profile=out, action_mode="absolute", interval=50, reward="dynamix")
    spec = env.backend.spec
    obs, info = env.reset(seed=1)
    glob = 19 * spec.num_workers  # the global features: val_accuracy, val_loss, accuracy_to_target
    first = obs[glob : glob + 3].copy()
    qualities, gains = [info["report"].val_accuracy], []
    for _ in range(6):
        obs, _, _, _, info = env.step(np.full(spec.num_workers, 16, np.float32))
        terms, report = info["reward_terms"], info["report"]
        assert terms["accuracy"] == report.val_accuracy  # the quality: 1 - WER / 100
        gains.append(terms["accuracy_gain"])
        qualities.append(report.val_accuracy)
    wers = [float(spec.metric.from_quality(q)) for q in qualities]
    assert wers[-1] < wers[0] - 10.0 and qualities[-1] > qualities[0]  # WER falls, quality rises
    assert sum(gains) > 0.0  # the gain term rewards the falling WER
    # Observed quality rises, loss and the distance to the target fall.
    assert obs[glob] > first[0] and obs[glob + 1] < first[1] and obs[glob + 2] < first[2]
    env.close()


@pytest.mark.integration
def test_evaluate_tables_show_the_metric_in_its_units(byo, tmp_path):
    _, out = byo
    from experiments.evaluate import record_run

    env = HeteroClusterEnv(profile=out, action_mode="absolute", interval=50)
    from dynamix_gym.controllers.static import StaticController
    from dynamix_gym.evaluation import run_episode

    ctrl = StaticController(16)
    result = run_episode(env, ctrl, seed=0, scenario="static_hetero")
    specs = {"cluster": env.backend.sim.cluster}
    record_run(tmp_path, result, ctrl, specs, env.backend.spec, 50)
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert row["metric"] == "wer" and row["target_metric"] == pytest.approx(TARGET_WER)
    assert bool(row["reached_target"]) and row["final_metric"] <= TARGET_WER
    assert row["final_metric"] == pytest.approx(100.0 * (1.0 - row["final_accuracy"]))
    timeline = pd.read_csv(tmp_path / "timeline.csv")
    assert timeline["val_metric"].iloc[-1] <= TARGET_WER < timeline["val_metric"].iloc[-2]
    env.close()


@pytest.mark.integration
def test_simulator_defaults_come_from_the_profile(byo):
    _, out = byo
    sim = Simulator(profile=out)
    assert sim.workload.name == "asr_byo" and sim.num_workers == 12
    assert sim.min_batch_value == 16  # no workload minimum: 16, within every cap (64)


# --- bad tables ------------------------------------------------------------------------------------
def _edit_traces(df: pd.DataFrame, case: str) -> pd.DataFrame:
    if case == "missing_column":
        return df.drop(columns=["grad_var"])
    if case == "non_numeric":
        df = df.astype({"metric": object})
        df.loc[4, "metric"] = "n/a"
        return df
    if case == "metric_out_of_range":
        df.loc[2, "metric"] = 130.0
        return df
    if case == "single_batch":
        return df[df["global_batch"] == 64]
    raise AssertionError(case)


def _edit_table(df: pd.DataFrame, case: str) -> pd.DataFrame:
    if case == "missing_column":
        return df.drop(columns=["sync_time_s"])
    if case == "non_numeric":
        df = df.astype({"step_time_s": object})
        df.loc[1, "step_time_s"] = "fast"
        return df
    if case == "single_batch":
        return df[df["local_batch"] == 16]
    raise AssertionError(case)


BAD = [
    ("traces", "missing_column", r"convergence traces traces\.csv lack required column\(s\) \['grad_var'\]"),
    ("traces", "non_numeric", r"metric in row 5 \(line 6\) of traces\.csv must be a finite number, got 'n/a'"),
    ("traces", "metric_out_of_range", r"metric in row 3 \(line 4\) of traces\.csv must be in \[0, 100\].*wer.*got .130(\.0)?."),
    ("traces", "single_batch", r"global_batch in traces\.csv \(rows 1-12\) holds a single batch size \[64\]"),
    ("table", "missing_column", r"profile table throughput\.csv lacks required column\(s\) \['sync_time_s'\]"),
    ("table", "non_numeric", r"step_time_s in row 2 \(line 3\) of throughput\.csv must be a finite number, got 'fast'"),
    ("table", "single_batch", r"local_batch in row 1 \(line 2\) of throughput\.csv .*\(T4, asr_byo\) holds a single batch size \[16\]"),
]  # fmt: skip


@pytest.mark.parametrize(("which", "case", "message"), BAD, ids=[f"{w}-{c}" for w, c, _ in BAD])
def test_bad_tables_name_file_column_and_row_and_leave_nothing(tmp_path, which, case, message):
    inputs = write_inputs(tmp_path / "in")
    path = inputs[which]
    edit = _edit_traces if which == "traces" else _edit_table
    edit(pd.read_csv(path, dtype={"placement": str}), case).to_csv(path, index=False)
    out = tmp_path / "result" / "profile"
    cfg = calibrate_config(inputs, out)
    with pytest.raises(ValueError, match=message):
        calibrate(cfg)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no temporary directory left either


def test_a_target_outside_the_metric_range_is_refused(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    text = inputs["workload"].read_text().replace("target_accuracy: 15.0", "target_accuracy: 150.0")
    inputs["workload"].write_text(text)
    cfg = calibrate_config(inputs, tmp_path / "out", traces=False)
    with pytest.raises(
        ValueError, match=r"target_accuracy \(wer, higher is worse\) must be in \[0, 100\), got 150\.0"
    ):
        calibrate(cfg)
    assert not (tmp_path / "out").exists()


# --- the shipped applications through the same path ---------------------------------------------
def test_app_specs_of_the_shipped_fit_agree_with_the_presets_metrics():
    for app, spec in APP_SPECS.items():
        m = WORKLOADS[app].metric
        assert m.scale == spec.metric_scale, app
        assert m.to_quality(m.untrained) == pytest.approx(spec.acc_chance), app


def test_bert_preset_and_reference_traces_refit_the_shipped_bert_model():
    """The bring-your-own reader and spec, given BERT's preset and its reference traces (F1 in
    percent), give the shipped model: no code edit (APP_SPECS) is needed for a new application."""
    wl = WORKLOADS["bert"]
    traces = read_traces(data_path(TRACES_FILE), wl)
    spec = app_spec(wl, traces)
    assert spec.targets == APP_SPECS["bert"].targets
    shipped = convergence_params("bert")
    fresh = fit_app("bert", traces, shipped.batch_memory_progress / shipped.total_progress, spec).params
    for f in ("base_batch", "acc_chance", "acc_ceiling", "gap_per_doubling", "stretch_exponent", "fit_rmse"):
        assert getattr(fresh, f) == pytest.approx(getattr(shipped, f), rel=1e-6, abs=1e-9), f
    assert fresh.shape_y == pytest.approx(shipped.shape_y, rel=1e-6, abs=1e-9)


def test_without_traces_a_new_workload_must_name_a_shipped_convergence_model(tmp_path):
    inputs = write_inputs(tmp_path / "in")
    cfg = calibrate_config(inputs, tmp_path / "out", traces=False)
    with pytest.raises(ValueError, match=r"convergence model 'asr_byo' is not shipped .*give traces=<csv>"):
        calibrate(cfg)
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_evaluate_app_runs_a_byo_profile_with_its_metric(byo, tmp_path):
    """python -m experiments.evaluate profile=<dir>: the profile's cluster, workload and fits."""
    _, out = byo
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"profile={out}", "controller=dlb",
         f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert row["workload"] == load_profile(out).workload.name and row["metric"] == "wer"
    assert bool(row["reached_target"]) and row["final_metric"] <= TARGET_WER
