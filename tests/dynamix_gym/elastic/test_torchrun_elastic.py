"""The elastic example under ``torchrun --nnodes=1:2 --max-restarts=3`` (torch.distributed.elastic):
a second agent joins (a rank is added), then a rank is killed; the run resumes from its checkpoint
each time and finishes, losing at most one checkpoint interval. Every process is reaped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import ROOT

EXAMPLE = ROOT / "adapters" / "examples" / "torchrun_elastic.py"
CHECKPOINT_EVERY = 20
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _progress(root: Path) -> dict:
    try:
        return json.loads((root / "progress.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait(pred, what: str, procs: list[subprocess.Popen], timeout_s: float = 150.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise AssertionError(f"an agent exited with {p.returncode} while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _reap(procs: list[subprocess.Popen]) -> None:
    """Kill every agent's process group (agents and their workers) and wait for them."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait(timeout=30)


def test_a_rank_added_and_a_rank_killed_under_torchrun_elastic(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    root = tmp_path / "job"
    cmd = [
        torchrun,
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        "--rdzv-id=elastic-test",
        "--rdzv-conf=last_call_timeout=1,join_timeout=120",
        "--monitor-interval=0.5",
        str(EXAMPLE),
        "--checkpoint-dir",
        str(root),
        "--iterations",
        "240",
        "--interval",
        "10",
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--step-sleep-s",
        "0.05",
    ]
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE: see the example's docstring (scale-up rendezvous).
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    logs = [open(tmp_path / f"agent{i}.log", "w") for i in range(2)]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        _wait(lambda: _progress(root).get("step", 0) >= 30, "30 steps at one rank", procs)
        # A rank added: a second agent joins; the group restarts at two ranks from the checkpoint.
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        _wait(lambda: _progress(root).get("world") == 2, "the group at two ranks", procs)
        resumed_at_two = _progress(root)["starts"][-1]["resumed_step"]
        _wait(lambda: _progress(root).get("step", 0) >= resumed_at_two + 30, "30 steps at two ranks", procs)
        # A rank killed: its agent restarts the group from the last checkpoint.
        victim = int((root / "pids" / "rank1.pid").read_text())
        starts_before = len(_progress(root)["starts"])
        os.kill(victim, signal.SIGKILL)
        _wait(
            lambda: len(_progress(root).get("starts", [])) > starts_before, "a restart after the kill", procs
        )
        _wait(lambda: _progress(root).get("done", False), "the run to finish", procs, timeout_s=240)
        for p in procs:
            p.wait(timeout=120)
    finally:
        _reap(procs)
        for f in logs:
            f.close()
    agent_logs = [(tmp_path / f"agent{i}.log").read_text()[-3000:] for i in range(2)]
    assert [p.returncode for p in procs] == [0, 0], agent_logs
    prog = _progress(root)
    starts = prog["starts"]
    assert starts[0]["world"] == 1 and starts[0]["resumed_step"] == 0
    assert any(s["world"] == 2 for s in starts[1:]), starts  # the added rank took part
    assert len(starts) >= 3, starts  # first start, the scale-up, the restart after the kill
    for s in starts[1:]:
        # Each restart resumed from a checkpoint at most one interval behind the last step run.
        assert 0 <= s["last_step_seen"] - s["resumed_step"] <= CHECKPOINT_EVERY, s
        assert s["resumed_step"] > 0
    assert prog["step"] == 240 and prog["done"]
    assert prog["final_accuracy"] > 0.8
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
