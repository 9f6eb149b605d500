"""The adapter's entry points run as a user runs them: deploy app, torchrun example, GPU check."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT

from dynamix_gym.evaluation import SUMMARY_COLUMNS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _run(cmd: list[str], timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # real DDP ranks: make test-slow
def test_deploy_app_runs_a_baseline_on_real_ddp_and_writes_the_evaluation_summary(tmp_path):
    proc = _run(
        [
            sys.executable,
            "-m",
            "experiments.deploy",
            "policy=dlb",
            f"out_dir={tmp_path}",
            "env.interval=10",
            "env.max_decisions=3",
            "backend.target_accuracy=1.0",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1
    row = rows[0]
    assert list(row)[: len(SUMMARY_COLUMNS)] == list(SUMMARY_COLUMNS)
    assert row["controller"] == "dlb" and row["backend"] == "real"
    assert row["decisions"] == "3" and row["workers"] == "2" and row["workload"] == "cnn/mnist"
    assert float(row["total_time_s"]) > 0 and 0 < float(row["final_accuracy"]) <= 1
    with open(tmp_path / "timeline.csv") as fh:
        timeline = list(csv.DictReader(fh))
    assert [r["step"] for r in timeline] == ["0", "1", "2", "3"]


def _torchrun_example(*args: str) -> subprocess.CompletedProcess:
    """``adapters/examples/torchrun_digits.py`` under torchrun with 2 local ranks and ``args``."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    example = "adapters/examples/torchrun_digits.py"
    return _run([torchrun, "--nproc-per-node", "2", "--standalone", example, *args])


@pytest.mark.slow  # real DDP ranks: make test-slow
def test_torchrun_example_moves_batch_to_the_fast_rank():
    proc = _torchrun_example(
        "--policy",
        "dlb",
        "--policy-kwargs",
        '{"global_batch": null}',  # keep the initial global batch (64) and split it
        "--slowdown",
        "1,3",
        "--iterations",
        "100",
        "--interval",
        "25",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = re.search(
        r"done: (\d+) steps, (\d+) decisions, val acc ([\d.]+).*local batches \[(\d+), (\d+)\]", proc.stdout
    )
    assert done, proc.stdout
    _steps, decisions, _acc, b0, b1 = done.groups()
    assert int(decisions) >= 1
    assert int(b0) > int(b1)  # rank 1 emulates a 3x slower device: DLB gives rank 0 more work


@pytest.mark.slow  # real DDP ranks: make test-slow
def test_torchrun_drop_in_drives_a_scale_free_bundle():
    """The universal bundle (observation schema 3, masked scale steps) in the drop-in: it gets the
    bundle's schema and steps, not the env defaults (schema 1 and deltas, which it once got and
    failed on at its first decision)."""
    proc = _torchrun_example(
        "--policy", "results/policies/universal", "--iterations", "75", "--interval", "25"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"done: 75 steps, 3 decisions, .*\(policy ppo[,)]", proc.stdout), proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the clean skip; the GPU test runs it for real")
def test_gpu_check_skips_cleanly_without_cuda():
    proc = _run([sys.executable, "-m", "adapters.gpu_check"], timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.startswith("SKIP: no CUDA device")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check_passes_on_a_gpu():
    proc = _run([sys.executable, "-m", "adapters.gpu_check"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout
