"""The torchrun drop-in asks the arbitrator for its batches, and trains on when it is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TOKEN
from support import ROOT

from dynamix_gym.service.translog import read_log

JOB = Path(__file__).with_name("ddp_job.py")


def _torchrun(address: str, out: Path) -> dict:
    env = {**os.environ, "DYNAMIX_ARBITRATOR_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB)]
    proc = subprocess.run(
        [*cmd, address, str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=150
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _deploy(running, out_dir: Path, token: str, job_id: str, *overrides: str) -> subprocess.CompletedProcess:
    """The deploy app on real DDP ranks, asking the service as job ``job_id`` with ``token``."""
    env = {**os.environ, "DYNAMIX_ARBITRATOR_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "experiments.deploy", f"arbitrator={running.address}"]
    cmd += [f"+arbitrator_kwargs.job_id={job_id}", f"out_dir={out_dir}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=170, env=env)


@pytest.mark.integration
@pytest.mark.slow  # two torchrun launches: about a minute on two cores
def test_drop_in_controller_uses_the_service_and_survives_its_absence(running, tmp_path):
    served = _torchrun(running.address, tmp_path / "served.json")
    assert served["decisions"] == 6 and served["counts"]["decisions"] == 6
    assert served["counts"]["fallbacks"] == 0 and served["without_policy"] == 0
    logged = [r for r in read_log(running.log_path) if r["kind"] == "decision" and r["job"] == "ddp-job"]
    assert [r["seq"] for r in logged] == list(range(6))
    assert logged[0]["obs"] and len(logged[0]["action"]) == 2  # one row and one action per rank
    running.stop()
    alone = _torchrun(running.address, tmp_path / "alone.json")  # the service is gone
    assert alone["decisions"] == 6 and alone["counts"]["decisions"] == 0
    assert alone["counts"]["fallbacks"] == 6 and alone["without_policy"] == 6
    assert all(b == [32, 32] for b in alone["batches"])  # its initial batches throughout
    running.start()  # the fixture stops it again


@pytest.mark.integration
@pytest.mark.slow  # real DDP ranks spawned by the deploy app
def test_deploy_app_on_the_real_backend_asks_the_service(running, tmp_path):
    proc = _deploy(
        running,
        tmp_path,
        TOKEN,
        "deploy-job",
        "+arbitrator_kwargs.timeout_s=2.0",
        "env.interval=10",
        "env.max_decisions=3",
        "backend.target_accuracy=1.0",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = list(read_log(running.log_path))
    assert [r["seq"] for r in records if r["kind"] == "decision" and r["job"] == "deploy-job"] == [0, 1, 2]
    assert any(r["kind"] == "end" and r["job"] == "deploy-job" for r in records)  # closed with its report


@pytest.mark.integration  # real DDP ranks spawned by the deploy app (7-22 s: refused at registration)
@pytest.mark.slow  # make test-slow; make test keeps the refusal itself: test_arbitrator_refusals.py
def test_deploy_with_a_wrong_token_fails_naming_the_cause_and_the_service_logs_it(running, tmp_path, caplog):
    wrong = "wrong-token-0123456789abcdef"
    with caplog.at_level("WARNING", logger="dynamix_gym.service.transport"):
        proc = _deploy(running, tmp_path, wrong, "ddp-4", "env.max_decisions=3")
    assert proc.returncode != 0
    assert "refused job 'ddp-4' (Register: UNAUTHENTICATED: missing or wrong token)" in proc.stderr
    assert "allow_without_policy=true" in proc.stderr and wrong not in proc.stderr
    assert not (tmp_path / "summary.csv").exists()  # no run is reported as if the policy had decided
    refused = [r.getMessage() for r in caplog.records if r.name == "dynamix_gym.service.transport"]
    assert len(refused) == 1 and "(job 'ddp-4'): UNAUTHENTICATED" in refused[0] and wrong not in refused[0]
