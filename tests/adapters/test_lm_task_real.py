"""The language-model task on real gloo ranks: it trains, its falling metric ends an episode, and the
drop-in runs it."""

from __future__ import annotations

import itertools
import re
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from support import run_python

import dynamix_gym  # noqa: F401  (registers the envs)
from adapters.ddp_backend import DDPBackend
from adapters.tasks import LM_METRIC

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LM = {"dataset": "pystdlib", "model": "transformer", "val_fraction": 0.02, "base_lr": 0.2, "timeout_s": 30}


def test_lm_trains_on_two_ranks_and_its_validation_loss_falls():
    backend = DDPBackend(workers=2, initial_batch=16, target_val_loss=0.0, **LM)
    try:
        backend.reset(seed=0)
        reports = [backend.run_interval(np.array([16, 8]), 8) for _ in range(4)]
    finally:
        backend.close()
    losses = [r.val_loss for r in reports]
    assert losses[0] < np.log(256)  # below an untrained model's within the first interval
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.3, losses
    for r in reports:  # the quality travels as the report's val_accuracy, the loss as val_loss
        assert r.val_accuracy == pytest.approx(LM_METRIC.to_quality(r.val_loss))
        np.testing.assert_allclose(r.batch_accuracy, 1 - 0.1 * r.batch_loss, rtol=1e-6)
        assert np.all((r.batch_loss > 0) & (r.batch_loss < 10))
        assert r.samples == 24 * 8


def test_falling_metric_reaching_its_target_ends_the_episode():
    env = gym.make(
        "dynamix/RealDDP-v0",
        workers=2,
        emulate=None,
        target_val_loss=2.7,  # reached after a few dozen steps
        interval=10,
        max_decisions=12,
        action_mode="absolute",
        **LM,
    )
    try:
        env.reset(seed=0)
        spec = env.unwrapped.backend.spec
        assert spec.metric is LM_METRIC and spec.target_accuracy == pytest.approx(0.73)
        decisions = 0
        while decisions < 12:
            _, _, terminated, truncated, info = env.step(np.array([16.0, 16.0], dtype=np.float32))
            decisions += 1
            if terminated or truncated:
                break
    finally:
        env.close()
    report = info["report"]
    assert terminated and not truncated, (
        f"not reached after {decisions} decisions: val loss {report.val_loss}"
    )
    assert report.val_loss <= 2.7 and report.val_accuracy >= 0.73
    assert decisions >= 2  # the untrained model is above the target: it took training to get there


@pytest.mark.slow  # 16 s of real ranks; the LM's env-level real tests above run in make test
def test_the_drop_in_runs_the_language_model():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    proc = run_python(
        [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--standalone",
            "adapters/examples/torchrun_lm.py",
            "--policy",
            "dlb",
            "--policy-kwargs",
            '{"global_batch": null}',
            "--initial-batch",
            "16",
            "--interval",
            "10",
            "--iterations",
            "120",
            "--val-fraction",
            "0.02",
            "--target-val-loss",
            "3.0",
        ],
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = re.search(
        r"done: (\d+) steps, (\d+) decisions, val loss ([\d.]+) \(target 3, reached True\)", proc.stdout
    )
    assert done, proc.stdout + proc.stderr[-2000:]
    steps, decisions, val_loss = done.groups()
    assert 10 <= int(steps) < 120 and int(decisions) >= 1  # stopped at the target, not at the step cap
    assert float(val_loss) <= 3.0
