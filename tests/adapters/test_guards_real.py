"""The guards on real CPU ranks (gloo): a reckless controller wrecks a run without them and reaches
the target with them; the watchdog fires within two intervals of a collapse and rolls back; a run
where nothing goes wrong is bit-for-bit the same when the guards only watch."""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta

import numpy as np
import pytest
import torch.distributed as dist
from guard_ranks import dropin_lr_rank, dropin_rank

from adapters.ddp_backend import DDPBackend
from dynamix_gym.controllers.reckless import RecklessController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: A digits CNN that trains at lr 0.1 from local batch 16 (global 32, the base) and, under the
#: linear rule, is wrecked by a jump to 256 per rank (16 x the base learning rate).
RECKLESS_JOB = dict(
    workers=2, min_batch=8, max_batch=256, initial_batch=16, base_batch=32, base_lr=0.1,
    lr_rule="linear", target_accuracy=0.95, timeout_s=30,
)  # fmt: skip


def _episode(guards, seed: int = 0, max_steps: int = 30):
    env = HeteroClusterEnv(
        backend=DDPBackend(**RECKLESS_JOB, guards=guards), interval=10, action_mode="absolute"
    )
    try:
        result = run_episode(env, RecklessController(), seed, max_steps=max_steps)
    finally:
        env.close()
    return result


def test_a_reckless_controller_wrecks_the_run_without_guards_and_reaches_the_target_with_them():
    off = _episode("off")
    accs = [row["val_accuracy"] for row in off.timeline]
    assert not off.summary["reached_target"]
    assert max(accs) > 0.5 and accs[-1] < 0.2  # it trained, then collapsed to chance for good
    guarded = _episode(None)  # the defaults
    assert guarded.summary["reached_target"], [row["val_accuracy"] for row in guarded.timeline]
    assert guarded.summary["guard_mode"] == "act"


def test_the_watchdog_fires_within_two_intervals_of_a_collapse_and_rolls_back():
    # no cap, no ramp, no back-off: only the watchdog stands between the jump and the run (which collapses
    # again after the cool-down, so the fallback keeps control after the second rollback)
    result = _episode({"max_lr_gain": None, "lr_ramp_iters": 0, "max_rollbacks": 2, "lr_backoff": 1.0})
    tl = result.timeline
    first_bad = next(i for i, row in enumerate(tl) if i > 0 and row["val_accuracy"] < 0.3)
    fired = next(i for i, row in enumerate(tl) if row.get("guard_rollbacks", 0) > 0)
    assert fired - first_bad <= 1  # fired at the collapse's first or second interval
    assert (
        "rolled back" in tl[fired]["events"] and "back to the snapshot after interval" in tl[fired]["events"]
    )
    assert tl[fired]["val_accuracy"] > 0.5  # the re-run from the snapshot trains again
    assert result.summary["guard_rollbacks"] == 2 and result.summary["guard_time_lost_s"] > 0
    assert result.summary["reached_target"]  # the fallback held the snapshot's batches to the end
    held = [row for row in tl[fired:] if "fallback holds" in row["events"]]
    assert held and all(row["w0_batch"] == 16 for row in held)


def test_watching_guards_leave_a_run_bit_for_bit_unchanged():
    plan = [[16, 16], [32, 16], [48, 24], [24, 24]]
    runs = []
    for guards in ("off", "watch"):
        backend = DDPBackend(**{**RECKLESS_JOB, "base_lr": 0.05}, guards=guards)
        try:
            backend.reset(seed=4)
            reports = [backend.run_interval(np.array(b), 5) for b in plan]
            runs.append(([r.val_loss for r in reports], backend.parameters()[0]))
        finally:
            backend.close()
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_the_first_intervals_noise_estimate_does_not_raise_the_rate():
    # AdaScale at the job's batch, twice the base one: the gain rests on the noise-scale estimate, whose
    # first interval after initialisation overshoots; the guards drop it, so the rate stays the base
    # one through the second interval, and rises (the batch unchanged: at once) at the third.
    job = {**RECKLESS_JOB, "lr_rule": "adascale", "initial_batch": 32}
    rates = {}
    for label, guards in (("default", None), ("kept", {"lr_gain_warmup": 0})):
        backend = DDPBackend(**job, guards=guards)
        try:
            backend.reset(seed=0)
            rates[label] = []
            for _ in range(3):
                backend.run_interval(np.array([32, 32]), 5)
                rates[label].append(backend.last_lr)
        finally:
            backend.close()
    base = job["base_lr"]
    assert rates["default"][:2] == [base, base] and rates["default"][2] > base, rates
    assert rates["kept"][0] == base and rates["kept"][1] > base, rates


def _dropin(guards, steps: int = 400, rank_fn=dropin_rank) -> dict:
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_fn, args=(r, 2, store.port, guards, steps, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        return out.get(timeout=180)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def test_the_drop_in_leaves_the_first_intervals_noise_estimate_out_of_the_rate():
    # the drop-in's rule as the backend's (the test above): the rate its first decision sets for the
    # second interval is the base one; the second decision's rises
    rates = {label: _dropin(guards, steps=10, rank_fn=dropin_lr_rank)["rates"]
             for label, guards in (("default", None), ("kept", {"lr_gain_warmup": 0}))}  # fmt: skip
    assert rates["default"][0] == 0.1 and rates["default"][1] > 0.1, rates
    assert rates["kept"][0] > 0.1, rates


@pytest.mark.slow  # 30 s of real ranks; the env-level guard tests above run in make test
def test_the_drop_in_rolls_a_reckless_job_back_and_reaches_the_target():
    wrecked = _dropin("off")
    assert not wrecked["done"] and wrecked["accs"][-1] < 0.2
    saved = _dropin({"max_lr_gain": None, "lr_ramp_iters": 0, "max_rollbacks": 1})
    assert saved["done"], saved
    assert saved["guard"]["guard_rollbacks"] == 1
    assert any("rolled back" in e for e in saved["events"])
