"""The fidelity app end to end on a tiny setup: calibrate two digits ranks, run two controllers on the
real backend and in the calibrated simulator, write the report; then rebuild it without measuring."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
from support import run_app

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return run_app(module, "progress=false", *args, timeout=500)


def test_fidelity_report_from_a_small_calibrated_profile(tmp_path):
    prof = tmp_path / "profile"
    proc = _run(
        "experiments.calibrate", f"out_dir={prof}", "ladder.batches=[8,16,32,64,128]", "ladder.iterations=5",
        "ladder.repeats=2", "overhead.intervals=8", "curves.local_batches=[16,64]", "curves.seeds=[0]",
        "curves.progress=120", "curves.budget_s=60", "interval=5", "real.dataset=digits", "real.max_batch=128",
        "real.target_accuracy=0.85", "workload.name=digits_cnn",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "report"
    controllers = "[{static: {batch: 32}}, {dlb: {global_batch: null}}]"
    proc = _run(
        "experiments.fidelity", f"profile={prof}", f"out_dir={out}", f"controllers={controllers}",
        "real_seeds=[0,1]", "sim_seeds=[0,1]", "speed_ladder.batches=[16,64]", "speed_ladder.iterations=5",
        "speed_ladder.repeats=2", "time_budget_s=30",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["iteration_time_mdape"]) == {"cpu"}
    assert 0.0 <= summary["iteration_time_mdape"]["cpu"] < 1.0
    assert -1.0 <= summary["kendall_tau"] <= 1.0
    assert set(summary["time_to_accuracy"]) == {"static-32", "dlb"}
    assert summary["ppo"] is None  # no PPO controller asked for
    assert len(summary["loadavg"]["samples"]) >= 4
    report = (out / "report.md").read_text()
    assert report.splitlines()[0].startswith("# Sim-to-real fidelity")
    assert "python -m experiments.fidelity" in report and "python -m experiments.calibrate" in report
    for png in ("iteration_time.png", "accuracy_curves.png", "tta.png"):
        assert (out / png).stat().st_size > 10_000
    first = summary["time_to_accuracy"]
    proc = _run(
        "experiments.fidelity", f"profile={prof}", f"out_dir={out}", f"controllers={controllers}",
        "reanalyse=true",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    again = json.loads((out / "summary.json").read_text())
    assert again["time_to_accuracy"] == first
    assert "reanalyse" not in again["commands"]["fidelity"]

    # deployed as a user would: the profile measured right before the runs (the quick ladder), the
    # simulated side on its refit, the deployment verdicts in the summary and the report
    dep = tmp_path / "deploy"
    deploy_args = (
        f"profile={prof}", f"out_dir={dep}", f"controllers={controllers}", "real_seeds=[0,1]", "sim_seeds=[0]",
        "speed_ladder.enabled=false", "time_budget_s=30", "calibrate.quick=true", "calibrate.batches=[16,32,64,128]",
        "calibrate.max_s=40", "calibrate.refuse=false",
    )  # fmt: skip
    proc = _run("experiments.fidelity", *deploy_args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (dep / "profile_refit" / "profile.json").is_file() and (dep / "calibration_quick.json").is_file()
    d = json.loads((dep / "summary.json").read_text())["deployment"]
    assert d["calibration"]["verdict"] in ("accepted", "over tolerance, deployed anyway")
    assert d["calibration"]["refit_profile"].endswith("profile_refit")
    assert set(d["per_controller"]) == {"static-32", "dlb"} and d["best_static"] == "static-32"
    assert all(
        r["runs"] == 2 and r["median_ci95"][0] <= r["median_s"] <= r["median_ci95"][1]
        for r in d["per_controller"].values()
    )
    assert d["learned"] == {} and d["finetune"] == {}
    assert "## Deployment" in (dep / "report.md").read_text()
    proc = _run("experiments.fidelity", *deploy_args, "reanalyse=true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((dep / "summary.json").read_text())["deployment"] == d

    # a campaign re-read after a change of the simulator: the real episodes kept, the simulated ones run again
    before = pd.read_csv(dep / "runs.csv")
    proc = _run("experiments.fidelity", *deploy_args, "reanalyse=true", "resimulate=true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = pd.read_csv(dep / "runs.csv")
    real = before.backend == "real"
    pd.testing.assert_frame_equal(
        after[after.backend == "real"].reset_index(drop=True), before[real].reset_index(drop=True)
    )
    assert (after.backend == "sim").sum() == (~real).sum()
    assert "resimulated_utc" in json.loads((dep / "measured.json").read_text())["conditions"]

    # the profile's convergence model refitted from the curves it measured, measuring nothing
    models = prof / "convergence_models.json"
    name_before = json.loads(models.read_text())["models"][0]["name"]
    doc = json.loads(models.read_text())  # a gradient spread fitted to real ranks (fit_grad_spread) stays
    doc["models"][0] |= {"grad_norm_cv": 0.3, "grad_norm_cv_exponent": 0.1}
    models.write_text(json.dumps(doc))
    proc = _run("experiments.calibrate", f"out_dir={prof}", "refit_convergence=true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((prof / "profile.json").read_text())
    assert doc["provenance"]["refits"][-1]["what"].startswith("convergence model refitted")
    refitted = models.read_text()
    assert "progress_noise_factor" in refitted
    assert json.loads(refitted)["models"][0]["name"] == name_before
    assert json.loads(refitted)["models"][0]["grad_norm_cv"] == 0.3
    proc = _run("experiments.calibrate", f"out_dir={tmp_path / 'nowhere'}", "refit_convergence=true")
    assert proc.returncode != 0 and "no profile in" in proc.stderr
