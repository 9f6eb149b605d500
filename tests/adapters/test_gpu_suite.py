"""The GPU suite's plumbing on CPU (adapters.gpu_suite, adapters.gpu_race): every CUDA part skipped
with its message and the summary written; the ladder's table writer in the reference format (on
the simulator and on one real DDP rank); the table fitted by experiments.calibrate and composed
into the race's profile, which the simulator runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from support import ROOT

from adapters.gpu_ladder import calibrate_table, ddp_factory, ladder_table, run_group, write_table
from adapters.gpu_race import CONTROLLERS, INITIAL_BATCH, race_profile, race_scenario, t4_speed
from adapters.gpu_suite import PARTS, gpu_label
from adapters.sim2real import controller_specs, run_one, sim_env, spec_controller
from dynamix_gym.backends.sim_backend import SimBackend
from sim.cluster import ClusterSpec, NodeSpec
from sim.faults import Scenario
from sim.fitting.table import REQUIRED_COLUMNS, read_profile_table
from sim.profile import load_profile

QUIET = Scenario(name="quiet", compute_noise_cv=0.0, measurement_noise_cv=0.0)
LADDER = {1: [8, 16, 32, 64], 2: [8, 16, 32]}


def suite(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "adapters.gpu_suite", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sim_factory(workers: int) -> SimBackend:
    """The simulator as the ladder's backend: T4 workers, noise-free."""
    return SimBackend(
        ClusterSpec("t4", (NodeSpec(gpu="T4", gpus=workers),)), "cifar10", scenario=QUIET, min_batch=8
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the suite runs its parts for real")
def test_cpu_run_skips_every_cuda_part_and_writes_the_summary(tmp_path):
    out = tmp_path / "suite"
    proc = suite(str(out), "--budget-s", "60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for part in PARTS:
        assert f"CUDA not available: skipping {part}\n" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["machine"]["cuda"] is False
    assert {p: r["status"] for p, r in summary["parts"].items()} == dict.fromkeys(PARTS, "skipped")
    md = (out / "summary.md").read_text()
    assert md.startswith("# GPU suite\n") and f"python -m adapters.gpu_suite {out} --budget-s 60" in md
    assert all(f"| {p} | skipped |" in md for p in PARTS)
    # nothing measured is claimed: no part folder, no table
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "summary.md"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget-s", "900"], "--budget-s must be in [10, 480] seconds, got 900.0"),
        (["--parts", "gpu_check,warp"], "unknown part(s) ['warp']"),
        (["--seeds", "0,x"], "--seeds must be comma-separated integers"),
        (["--ranks", "1"], "--ranks must be >= 2, got 1"),
    ],
)
def test_bad_options_fail_naming_the_option_and_write_nothing(tmp_path, args, message):
    out = tmp_path / "suite"
    proc = suite(str(out), *args)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not out.exists()


def test_gpu_label_names_the_worker_type():
    assert gpu_label("NVIDIA H200") == "H200"
    assert gpu_label("NVIDIA A100-SXM4-80GB") == "A100SXM480GB"
    assert gpu_label("") == "cuda"


def test_ladder_rows_are_the_reference_table_format(tmp_path):
    rows, notes = ladder_table(
        sim_factory, app="cifar10", gpu="H200", model="toy", batches=LADDER, iterations=3, repeats=2,
        warmup_iterations=1, budget_s=60,
    )  # fmt: skip
    assert notes == []
    path = write_table(tmp_path / "step_times.csv", rows)
    table = read_profile_table(path)
    assert set(REQUIRED_COLUMNS) <= set(table.columns)
    got = sorted(zip(table["num_gpus"], table["local_batch"], strict=True))
    assert got == sorted((w, b) for w, bs in LADDER.items() for b in bs)  # 1 x 64 after the common batches
    assert (table["gpu"] == "H200").all() and (table["app"] == "cifar10").all()
    assert (table["placement"] == table["num_gpus"].astype(str)).all()
    one, two = table[table.num_gpus == 1], table[table.num_gpus == 2]
    assert (one["sync_time_s"] == 0).all() and (two["sync_time_s"] > 0).all()
    assert (table["sync_time_s"] <= table["step_time_s"]).all()
    # step times rise with the batch (the simulated T4's compute model)
    assert one.sort_values("local_batch")["step_time_s"].is_monotonic_increasing


def test_ladder_stops_at_its_budget_and_says_so():
    rows, notes = ladder_table(
        sim_factory, app="cifar10", gpu="H200", model="toy", batches=LADDER, iterations=3, repeats=2,
        warmup_iterations=1, budget_s=0.5,
    )  # fmt: skip
    assert rows == []
    assert any("out of time before" in n for n in notes)


def test_write_table_rejects_a_bad_row_and_writes_nothing(tmp_path):
    rows, _ = ladder_table(
        sim_factory, app="cifar10", gpu="H200", model="toy", batches={1: [8, 16]}, iterations=2, repeats=1,
        warmup_iterations=1, budget_s=60,
    )  # fmt: skip
    rows[0]["step_time_s"] = -1.0
    with pytest.raises(ValueError, match="step_time_s"):
        write_table(tmp_path / "t.csv", rows)
    assert not (tmp_path / "t.csv").exists()


def test_real_ddp_ladder_on_one_cpu_rank(tmp_path):
    """The path the GPU runs (real DDP ranks through DDPBackend), tiny, on the CPU."""
    batches = {1: [8, 16]}
    rows, notes = ladder_table(
        ddp_factory("cpu", "cnn", "synthetic", batches), app="toy_cnn", gpu="cpu", model="cnn/synthetic",
        batches=batches, iterations=2, repeats=2, warmup_iterations=1, budget_s=120,
    )  # fmt: skip
    assert notes == []
    table = read_profile_table(write_table(tmp_path / "t.csv", rows))
    assert table["local_batch"].tolist() == [8, 16]
    assert (table["step_time_s"] > 0).all() and (table["sync_time_s"] == 0).all()


@pytest.mark.slow
def test_table_mode_profile_feeds_the_race_profile_and_the_simulator(tmp_path):
    rows = []
    for app in ("cifar10", "mnist_cnn"):  # the ladder's two models (numbers from the simulator here)
        r, _ = ladder_table(
            sim_factory, app=app, gpu="H200", model="toy", batches={1: [8, 16, 32, 64], 4: [8, 16, 32, 64]},
            iterations=3, repeats=2, warmup_iterations=1, budget_s=60,
        )  # fmt: skip
        rows += r
    table = write_table(tmp_path / "step_times.csv", rows)
    fit = calibrate_table(table, tmp_path / "profile", "gpu_h200", "cifar10", {"H200": 141.0}, timeout_s=120)
    assert set(fit["loo_mdape"]) == {"H200/cifar10", "H200/mnist_cnn"}
    assert fit["holdout_mdape_all"] < 0.05  # noise-free simulated times: the fit recovers them
    assert fit["command"].startswith(f"python -m experiments.calibrate table={table} ")
    gp = load_profile(tmp_path / "profile")
    assert gp.gpu_memory_gib("H200") == pytest.approx(141.0)

    conv = load_profile(ROOT / "results" / "fidelity" / "profile")
    real = {**conv.meta["provenance"]["real_config"], "workers": 4, "device": "cuda"}
    prof = race_profile(tmp_path / "race", tmp_path / "profile", "H200", conv, 4, real)
    fitted = gp.compute[("H200", "mnist_cnn")]
    assert fitted.max_batch == 64
    assert prof.compute[("H200", "mnist_cnn")] == replace(fitted, max_batch=real["max_batch"])
    assert "extrapolated above 64" in prof.meta["calibration"]["notes"][0]
    assert prof.convergence_params("mnist_cnn") == conv.convergence_params("mnist_cnn")
    assert prof.cluster.gpu_types == ("H200",) * 4 and not prof.compute_on_host

    scenario = race_scenario(4)
    assert scenario.worker_speed == pytest.approx((t4_speed(), t4_speed(), 1.0, 1.0))
    assert 0.2 < t4_speed() < 0.6  # a T4 is 2-3x slower than a V100 on ResNet-18 at batch 512
    specs = controller_specs(CONTROLLERS, INITIAL_BATCH, None)
    assert [s["label"] for s in specs] == ["static-32", "static-128", "dlb", "rex"]  # no bundle: no PPO
    runs = []
    for sp in specs:
        mode = spec_controller(sp).action_mode
        env = sim_env(prof, scenario, sp["initial_batch"], mode, 20, "time", 25.0)
        runs.append(run_one(env, sp, 0, "sim", scenario.name))
    assert all(r["decisions"] > 0 for r in runs)
    assert pd.DataFrame([{k: v for k, v in r.items() if k != "timeline"} for r in runs])["reached"].any()


@pytest.mark.integration
def test_run_group_kills_a_part_and_everything_it_started_at_its_timeout(tmp_path):
    """A part past its budget goes with its whole process group: no rank is left behind."""
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    rc = run_group([sys.executable, "-c", script], timeout_s=3.0, log_path=tmp_path / "log.txt")
    assert rc == 124 and time.monotonic() - t0 < 20
    grandchild = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 5
    while running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(grandchild)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the part passes")
def test_a_part_that_fails_records_why(tmp_path):
    proc = suite(str(tmp_path), "--run-part", "gpu_check", "--part-budget-s", "30")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check" / "result.json").read_text())
    assert doc["status"] == "failed" and doc["reason"] and "result" not in doc


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_whole_suite_passes_on_a_gpu(tmp_path):
    proc = suite(str(tmp_path), "--budget-s", "450", timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert proc.returncode == 0, json.dumps(summary["parts"], indent=1)[-3000:]
    assert summary["wall_s"] < 480
    assert {p: r["status"] for p, r in summary["parts"].items()} == dict.fromkeys(PARTS, "ok")
