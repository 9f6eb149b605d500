"""The balanced split (``split="balanced"``): the policy's batches set the global batch, the env
shares it by measured throughput; the same rule in the env, the arbitrator's sessions and the
torchrun drop-in (:class:`dynamix_gym.actions.ActionRule`), recorded in bundles."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from stable_baselines3 import PPO

from dynamix_gym import HeteroClusterEnv
from dynamix_gym.actions import ActionRule, balanced_split
from dynamix_gym.controllers.bundle import BundleMeta, BundleMismatchError, PPOController, save_bundle
from dynamix_gym.envs.vec_env import PerWorkerVecEnv
from dynamix_gym.evaluation import run_episode
from sim.protocol import BackendSpec


def _spec(n: int, lo: int = 8, hi: int = 1024) -> BackendSpec:
    env = HeteroClusterEnv(workers=n)
    spec = env.backend.spec
    env.close()
    spec.min_batch[:] = lo
    spec.max_batch[:] = hi
    return spec


def _report(batches, times, alive=None, iterations=50, reconfig_s=0.0):
    b = np.asarray(batches, dtype=np.int64)
    return SimpleNamespace(
        local_batch=b,
        compute_time_s=np.asarray(times, dtype=np.float64),
        alive=np.ones(b.size, dtype=bool) if alive is None else np.asarray(alive, dtype=bool),
        iterations=np.full(b.size, iterations),
        reconfig_time_s=reconfig_s,
    )


def test_the_global_batch_is_kept_and_shared_by_measured_throughput():
    spec = _spec(3)
    current = np.array([100, 100, 100])
    # worker 0 ran 100 samples in 0.1 s (1000/s), the others in 0.2 s and 0.4 s
    report = _report(current, [0.1, 0.2, 0.4])
    requested = np.array([200, 100, 50])  # the policy's batches: global batch 350
    out = balanced_split(requested, current, report, spec)
    assert out.sum() == 350
    assert out.tolist() == [200, 100, 50]  # 1000 : 500 : 250 samples/s
    # the shares follow throughput, not the policy's own per-worker choice
    out = balanced_split(np.array([50, 100, 200]), current, report, spec)
    assert out.tolist() == [200, 100, 50]


def test_ranges_dead_workers_and_the_tolerance():
    spec = _spec(3, lo=8, hi=150)
    current = np.array([100, 100, 100])
    report = _report(current, [0.1, 0.2, 0.4])
    out = balanced_split(np.array([200, 100, 50]), current, report, spec)
    assert out.tolist() == [150, 133, 67]  # worker 0 capped at 150, the rest shared 2:1
    dead = _report(current, [0.1, 0.0, 0.4], alive=[True, False, True])
    out = balanced_split(np.array([120, 100, 80]), current, dead, spec)
    assert out[1] == 100 and out[[0, 2]].sum() == 200 and out[0] == 150  # 4:1 capped at 150
    # nothing moves by more than 10% of the batches in force: no reconfiguration
    even = _report(current, [0.2, 0.2, 0.2])
    assert balanced_split(np.array([105, 100, 100]), current, even, spec).tolist() == [100, 100, 100]
    # one live worker: the policy's batches as they are
    lone = _report(current, [0.1, 0.0, 0.0], alive=[True, False, False])
    assert balanced_split(np.array([130, 90, 90]), current, lone, spec).tolist() == [130, 90, 90]


def test_the_cost_aware_split_re_splits_only_when_it_wins_back_the_pause():
    """balanced_cost: at a barely moved global batch a re-split must save more compute time over
    the interval than the last measured reconfiguration pause; a moved global batch always
    re-splits (its pause is paid anyway); no measured pause yet: as the plain balanced split."""
    from dynamix_gym.actions import observed_reconfig_s

    spec = _spec(2)
    current = np.array([100, 100])
    # 0.010 s vs 0.0125 s for 100 samples: the balanced split is [111, 89], slowest 0.0111 s,
    # saving 1.4 ms per iteration: 0.07 s over 50 iterations, 1.4 s over 1000
    report = _report(current, [0.010, 0.0125])
    same = np.array([100, 100])
    assert balanced_split(same, current, report, spec).tolist() == [111, 89]
    assert balanced_split(same, current, report, spec, reconfig_s=None).tolist() == [111, 89]
    assert balanced_split(same, current, report, spec, reconfig_s=1.0).tolist() == [100, 100]
    long = _report(current, [0.010, 0.0125], iterations=1000)
    assert balanced_split(same, current, long, spec, reconfig_s=1.0).tolist() == [111, 89]
    assert balanced_split(same, current, report, spec, reconfig_s=0.05).tolist() == [111, 89]
    # the global batch moves by more than the tolerance: re-split, whatever the pause
    assert balanced_split(np.array([150, 150]), current, report, spec, reconfig_s=1.0).sum() == 300
    # the same rule through the ActionRule of the arbitrator and the drop-in
    rule = ActionRule.for_spec("scale", spec, split="balanced_cost")
    keep = int(np.flatnonzero(rule.steps == 1.0)[0])
    assert rule.apply(np.array([keep, keep]), current, spec, report, 1.0)[0].tolist() == [100, 100]
    assert rule.apply(np.array([keep, keep]), current, spec, report, None)[0].tolist() == [111, 89]
    plain = ActionRule.for_spec("scale", spec, split="balanced")
    assert plain.apply(np.array([keep, keep]), current, spec, report, 1.0)[0].tolist() == [111, 89]
    # the pause the split reads: the latest interval that paid one
    assert observed_reconfig_s(None, _report(current, [0.1, 0.1])) is None
    assert observed_reconfig_s(None, _report(current, [0.1, 0.1], reconfig_s=0.8)) == 0.8
    assert observed_reconfig_s(0.8, _report(current, [0.1, 0.1])) == 0.8


def test_the_env_under_the_cost_aware_split_keeps_its_batches_on_a_short_interval():
    """NCF on four A100s, K = 50: an interval is ~0.9 s, a re-split's pause 1 s. After the first
    decision doubles every batch (a pause, measured), worker 0 throttles to 0.6x: the plain balanced
    split re-splits at every decision (and, its launch floor making its time fall slower than its
    batch, keeps shrinking it), the cost-aware one holds, since the saving is ~0.2 s a interval."""
    from sim.cluster import mixed_cluster
    from sim.faults import FaultWindow, Scenario

    throttled = Scenario(
        name="late_throttle",
        windows=(FaultWindow(kind="throttle", start_s=1.5, duration_s=1e6, worker=0, factor=0.6),),
    )

    def run(split):
        env = HeteroClusterEnv(
            cluster=mixed_cluster({"A100": 4}),
            workload="ncf",
            scenario=throttled,
            action_mode="scale",
            split=split,
            initial_batch=4096,
            max_decisions=6,
        )
        env.reset(seed=0)
        keep = int(np.flatnonzero(env.action_set == 1.0)[0])
        double = int(np.flatnonzero(env.action_set == 2.0)[0])
        changes, prev = 0, env.batches.copy()
        for k in range(6):
            info = env.step(np.full(4, double if k == 0 else keep))[4]
            changes += int(np.any(info["local_batches"] != prev))
            prev = info["local_batches"].copy()
        assert env._reconfig_s == pytest.approx(env.backend.sim.reconfig_delay_s)
        env.close()
        return changes, prev

    cost_changes, cost_last = run("balanced_cost")
    plain_changes, plain_last = run("balanced")
    assert cost_changes == 1 and plain_changes == 6
    assert cost_last.sum() == pytest.approx(plain_last.sum(), rel=0.02)  # the same global batch
    assert plain_last[0] < 0.25 * cost_last[0]


def test_bad_split_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="unknown split 'even'"):
        HeteroClusterEnv(workers=2, split="even")
    with pytest.raises(ValueError, match=r"split_tolerance must be a number in \[0, 1\)"):
        HeteroClusterEnv(workers=2, split="balanced", split_tolerance=1.5)
    with pytest.raises(ValueError, match="needs the last interval's report"):
        rule = ActionRule.for_spec("scale", _spec(2), split="balanced")
        rule.apply(np.array([2, 2]), np.array([64, 64]), _spec(2))


def test_the_env_shares_the_requested_global_batch_between_same_type_workers():
    """Two T4s and two V100s: a step on one T4 alone moves the global batch, and both T4s (and
    both V100s) end up with equal batches rather than drifting apart. (At 256 samples neither type
    sits at its host floor, which for the V100s is ~0.10 s, a T4's time at 128.)"""
    env = HeteroClusterEnv(
        cluster="t4v100_4", action_mode="scale", split="balanced", initial_batch=256, max_decisions=4
    )
    env.reset(seed=0)
    keep = int(np.flatnonzero(env.action_set == 1.0)[0])
    double = int(np.flatnonzero(env.action_set == 2.0)[0])
    action = np.full(4, keep)
    action[0] = double
    _, _, _, _, info = env.step(action)
    assert info["requested_batches"].tolist() == [512, 256, 256, 256]
    b = info["local_batches"]
    assert b.sum() == 1280
    types = env.backend.spec.gpu_types
    t4 = [i for i, t in enumerate(types) if t == "T4"]
    v100 = [i for i, t in enumerate(types) if t == "V100"]
    assert abs(int(b[t4[0]]) - int(b[t4[1]])) <= 0.1 * b[t4].mean()
    assert abs(int(b[v100[0]]) - int(b[v100[1]])) <= 0.1 * b[v100].mean()
    assert b[v100].min() > b[t4].max()  # the faster type gets more
    # the policy split leaves the same action as it was asked
    plain = HeteroClusterEnv(cluster="t4v100_4", action_mode="scale", initial_batch=256)
    plain.reset(seed=0)
    assert plain.step(action)[4]["local_batches"].tolist() == [512, 256, 256, 256]


def test_a_bundle_records_its_split_and_refuses_an_env_without_it(tmp_path):
    def make():
        return HeteroClusterEnv(
            workers=2, action_mode="scale", obs_schema=2, split="balanced", max_decisions=2
        )

    vec = PerWorkerVecEnv([make])
    model = PPO("MlpPolicy", vec, n_steps=8, batch_size=8, seed=0, device="cpu")
    meta = BundleMeta(
        obs_form="per_worker",
        action_set=[0.5, 0.8, 1.0, 1.25, 2.0],
        action_mode="scale",
        schema_version="2",
        split=vec.get_attr("split")[0],
    )
    controller = PPOController(save_bundle(tmp_path / "b", model, meta, None))
    assert controller.bundle.meta.split == "balanced"
    assert controller.env_options() == {
        "obs_schema": 2,
        "action_set": [0.5, 0.8, 1, 1.25, 2],
        "split": "balanced",
        "split_tolerance": 0.1,
    }
    res = run_episode(
        HeteroClusterEnv(workers=3, **controller.env_options(), action_mode="scale"), controller, 0
    )
    assert res.summary["decisions"] >= 1
    plain = HeteroClusterEnv(workers=3, action_mode="scale", obs_schema=2, max_decisions=2)
    with pytest.raises(BundleMismatchError, match="runs under split='balanced'"):
        run_episode(plain, controller, seed=0)
    # the ablation knob: the same policy under the other split
    assert PPOController(tmp_path / "b", split="policy").env_options().get("split") is None
    with pytest.raises(ValueError, match="unknown split"):
        BundleMeta(obs_form="per_worker", action_set=[0.5, 1.0], action_mode="scale", split="even")
