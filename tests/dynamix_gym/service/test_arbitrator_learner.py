"""Online fine-tuning: PPO updates from served experience, lineage, validation and rollback."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TOKEN, Running

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.service.client import RemoteController
from dynamix_gym.service.learner import LearnerConfig, OnlineLearner
from dynamix_gym.service.server import PolicyStore, ServiceConfig
from dynamix_gym.service.translog import read_log

TASK = {"workers": 4, "scenario": "throttle"}  # cifar10 on 2 T4 + 2 V100: min batches miss the target


def _serve_job(running, job_id: str, seed: int) -> dict:
    env = HeteroClusterEnv(**TASK, action_mode="absolute")
    ctl = RemoteController(running.address, token=TOKEN, job_id=job_id, task="cifar10x4", timeout_s=5.0)
    summary = run_episode(env, ctl, seed).summary
    ctl.close(final_report=env.unwrapped.last_report)
    return summary


def _poison(bundle, records: list[dict], n: int) -> list[tuple]:
    """Transitions that pay for shrinking every batch (action 0: -100) and punish the rest, every
    logged state with each of the five actions (a clean contrast in every state: random actions
    left it to the critic's values, and whether the update turned the policy then moved with the
    CPU's float kernels), with the serving policy's own log-probabilities and values (what the
    service would have logged)."""
    obs = np.array([row for r in records if r["kind"] == "decision" for row in r["obs"]], dtype=np.float32)
    k = np.arange(n)
    obs, actions = obs[(k // 5) % len(obs)], k % 5
    with torch.no_grad():
        dist = bundle.model.policy.get_distribution(torch.as_tensor(obs))
        logp = dist.log_prob(torch.as_tensor(actions)).numpy()
        values = bundle.model.policy.predict_values(torch.as_tensor(obs)).numpy().ravel()
    return [
        (f"poison{k % 8}", 0, obs[k], int(a), float(v), float(lp), 10.0 if a == 0 else -10.0, True, 0.0, 0)
        for k, (a, lp, v) in enumerate(zip(actions, logp, values, strict=True))
    ]


def _attach(running, tmp_path, validate, **config) -> OnlineLearner:
    """An online learner over ``running``'s default bundle, attached to its service."""
    learner = OnlineLearner(
        running.service.store,
        "default",
        tmp_path / "versions",
        validate=validate,
        config=LearnerConfig(**config),
        rng=np.random.default_rng(0),
        log=running.service.log,
    )
    running.service.learner = learner
    return learner


def test_learner_builds_transitions_from_served_jobs_and_validation_gates_promotion(bundle, tmp_path):
    scores = iter([100.0, 99.0])  # parent, candidate (a stub validator: the gate's logic alone)
    running = Running(bundle, tmp_path / "t.jsonl", ServiceConfig(explore=True))
    learner = _attach(
        running,
        tmp_path,
        lambda b: {"t": next(scores)},
        learning_rate=1e-5,
        update_every=64,
        window=4096,
        n_epochs=1,
        batch_size=64,
    )
    try:
        summary = _serve_job(running, "j0", 100)
        # one transition per worker per decision, the last one closed by the final report
        assert learner.buffered == 4 * summary["decisions"]
        entry = learner.step()
    finally:
        running.stop()
    assert entry["status"] == "promoted" and entry["version"] == 1 and entry["parent"] == 0
    assert entry["update"]["samples"] == learner.buffered and "policy_gradient_loss" in entry["update"]
    lineage = json.loads((tmp_path / "versions" / "lineage.json").read_text())["versions"]
    assert [e["version"] for e in lineage] == [0, 1]
    saved = json.loads((tmp_path / "versions" / "v001" / "bundle.json").read_text())
    assert saved["metadata"]["lineage"]["parent"] == 0
    assert running.service.store.get().version == 1


@pytest.mark.parametrize(("score", "promoted"), [("mean", True), ("geomean", False)])
def test_the_geomean_gate_weighs_every_validation_task_alike(bundle, tmp_path, score, promoted):
    """A candidate 2% faster on a long task and 20% slower on a short one: the mean in seconds
    promotes it, the geometric mean of per-task ratios does not."""
    scores = iter([{"bert": 1000.0, "ncf": 40.0}, {"bert": 980.0, "ncf": 48.0}])  # parent, candidate
    running = Running(bundle, tmp_path / "t.jsonl", ServiceConfig(explore=True))
    learner = _attach(
        running,
        tmp_path,
        lambda b: next(scores),
        learning_rate=1e-5,
        update_every=64,
        window=4096,
        n_epochs=1,
        batch_size=64,
        validation_score=score,
    )
    try:
        _serve_job(running, "j0", 100)
        entry = learner.step()
    finally:
        running.stop()
    assert entry["validation_ratio_to_parent"] == pytest.approx(np.sqrt(0.98 * 1.2))
    assert (entry["status"] == "promoted") is promoted
    with pytest.raises(ValueError, match=r"learner\.validation_score must be one of"):
        LearnerConfig(validation_score="median")


@pytest.mark.timeout(300)
def test_a_poisoned_experience_stream_is_rolled_back_on_measured_time_to_accuracy(bundle, tmp_path):
    running = Running(bundle, tmp_path / "t.jsonl")
    learner = _attach(
        running,
        tmp_path,
        lambda b: {"unused": 1.0},
        learning_rate=1e-2,  # one update that turns the policy (a milder one gave 1.1-1.2x, p ~ 0.05)
        update_every=64,
        window=4096,
        n_epochs=20,
        batch_size=256,
        clip_range=100.0,  # follows its data closely (one clipped PPO step moves a policy little)
        rollback_window=3,
    )
    seeds = range(100, 106)
    try:
        before = [_serve_job(running, f"pre{s}", s) for s in seeds]  # the pretrained version, measured
        records = list(read_log(running.log_path))
        learner.add_transitions(_poison(bundle, records, 8192))
        entry = learner.step(force=True, skip_validation=True)  # let it through: the rollback must catch it
        assert entry["status"] == "promoted" and running.service.store.get().version == 1
        after = []  # the poisoned version serves the same seeds until the measurement rolls it back
        for s in seeds:
            after.append(_serve_job(running, f"post{s}", s))
            if running.service.store.get().version == 0:
                break
    finally:
        running.stop()
    assert all(s["reached_target"] for s in before)
    # the poisoned policy shrinks batches: slower to the target (or missing it within the budget)
    tta_before = np.mean([s["time_to_accuracy_s"] for s in before[: len(after)]])
    assert np.mean([s["total_time_s"] for s in after]) > 1.1 * tta_before
    assert running.service.store.get().version == 0  # rolled back to the parent
    lineage = json.loads((tmp_path / "versions" / "lineage.json").read_text())["versions"]
    measured = lineage[-1]["measured"]
    assert lineage[-1]["status"] == "rolled_back" and lineage[-1]["measured_tta_ratio"] > 1.05
    assert measured["rollback"] and (measured["p_value"] is None or measured["p_value"] < 0.05)
    events = [r["kind"] for r in read_log(running.log_path) if r["kind"] in ("promote", "rollback")]
    assert events == ["promote", "rollback"]


def _measured_learner(tmp_path, bundle, measured: dict, **config) -> OnlineLearner:
    """A learner whose serving version 1 (parent 0) has the given measured jobs {(version, task): ttas}."""
    store = PolicyStore({"default": bundle})
    learner = OnlineLearner(
        store, "default", tmp_path / "v", validate=lambda b: {"t": 1.0}, config=LearnerConfig(**config)
    )
    learner.lineage.append({"version": 1, "parent": 0, "status": "promoted"})
    for key, ttas in measured.items():
        learner._measured[key] = list(ttas)
    return learner


def test_the_stratified_rollback_test_tells_a_regression_from_seed_noise(bundle, tmp_path):
    """One job per task and version is seed noise to the test (no noise estimate: only a gross
    regression rolls back); the same ratio over repeated jobs is a regression; the older window rule
    rolls back on the one wave."""
    one_wave = {(0, "a"): [500.0], (0, "b"): [40.0], (1, "a"): [557.0], (1, "b"): [49.0]}
    found = _measured_learner(tmp_path / "1", bundle, one_wave, rollback_window=2).regression(1)
    assert found["ratio"] == pytest.approx(np.exp(np.mean([np.log(557 / 500), np.log(49 / 40)])))
    assert found["df"] is None and found["p_value"] is None and not found["rollback"]
    window = _measured_learner(tmp_path / "2", bundle, one_wave, rollback_window=2, rollback_test="window")
    assert window.regression(1)["rollback"]
    rng = np.random.default_rng(0)
    noise = lambda n: np.exp(rng.normal(0.0, 0.03, n))  # noqa: E731
    repeated = {
        (0, "a"): 500 * noise(6),
        (0, "b"): 40 * noise(6),
        (1, "a"): 1.15 * 500 * noise(6),
        (1, "b"): 1.15 * 40 * noise(6),
    }
    found = _measured_learner(tmp_path / "3", bundle, repeated, rollback_window=2).regression(1)
    assert found["ratio"] == pytest.approx(1.15, abs=0.03)
    assert 15 < found["df"] <= 20 and found["p_value"] < 1e-6 and found["rollback"]
    # a seed-noisy task (NCF on a starved pipeline: 40-130 s) does not hide a clear regression on a
    # quiet one: each task weighs by its own noise
    quiet_and_noisy = {
        (0, "quiet"): [335.1, 330.5, 348.4, 333.5],
        (0, "noisy"): [48.3, 109.8, 131.5, 39.8],
        (1, "quiet"): [371.4, 351.2, 362.9],
        (1, "noisy"): [70.4, 59.2, 50.0],
    }
    found = _measured_learner(tmp_path / "7", bundle, quiet_and_noisy, rollback_window=2).regression(1)
    assert 1.06 < found["ratio"] < 1.09 and found["p_value"] < 0.01 and found["rollback"]
    same = {k: (500 if k[1] == "a" else 40) * noise(6) for k in repeated}
    found = _measured_learner(tmp_path / "4", bundle, same, rollback_window=2).regression(1)
    assert not found["rollback"]
    gross = {(0, "a"): [500.0], (1, "a"): [700.0]}
    assert _measured_learner(tmp_path / "5", bundle, gross, rollback_window=1).regression(1)["rollback"]
    assert (
        _measured_learner(tmp_path / "6", bundle, {(0, "a"): [500.0]}, rollback_window=1).regression(1)
        is None
    )


def test_a_masked_bundle_learns_from_its_logged_masks(tmp_path):
    """A MaskablePPO bundle: the service logs each decision's legal steps, the learner's buffer
    keeps them, and the update is MaskablePPO's, whose masked log-probabilities of the logged
    actions are the ones the service sampled with (PPO's ratio starts at 1)."""
    from sb3_contrib import MaskablePPO
    from support import UNIVERSAL_BUNDLE

    from dynamix_gym.controllers.bundle import load_bundle

    universal = load_bundle(UNIVERSAL_BUNDLE)
    running = Running(universal, tmp_path / "t.jsonl", ServiceConfig(explore=True))
    learner = OnlineLearner(
        running.service.store,
        "default",
        tmp_path / "versions",
        validate=lambda b: {"t": 1.0},
        config=LearnerConfig(learning_rate=1e-5, update_every=16, window=4096, n_epochs=1, batch_size=64),
        rng=np.random.default_rng(0),
    )
    running.service.learner = learner
    try:
        env = HeteroClusterEnv(workers=4, workload="ncf", scenario="throttle", action_mode="absolute")
        ctl = RemoteController(running.address, token=TOKEN, job_id="m0", timeout_s=5.0)
        run_episode(env, ctl, 3)
        ctl.close(final_report=env.unwrapped.last_report)
    finally:
        running.stop()
    data = learner.transitions()
    assert data and all(len(t) == 11 and t[10] is not None for t in data)
    obs = torch.as_tensor(np.stack([t[2] for t in data]))
    actions = torch.as_tensor([t[3] for t in data])
    masks = np.stack([t[10] for t in data])
    logged = np.array([t[5] for t in data])
    policy = universal.model.policy
    with torch.no_grad():
        _, masked, _ = policy.evaluate_actions(obs, actions, action_masks=masks)
        _, unmasked, _ = policy.evaluate_actions(obs, actions)
    assert np.allclose(masked.numpy(), logged, atol=2e-3)  # logged obs are rounded to 4 digits
    assert not masks.all() and not np.allclose(unmasked.numpy(), logged, atol=2e-3)
    model, stats = learner.update(running.service.store.get().bundle, data)
    assert isinstance(model, MaskablePPO) and stats["samples"] == len(data)
    assert stats["approx_kl"] < 0.05


def test_an_update_does_not_depend_on_the_order_concurrent_jobs_reported_in(bundle, tmp_path):
    from dynamix_gym.service.server import PolicyStore

    rng = np.random.default_rng(5)
    obs = rng.normal(size=(2, 40, bundle.model.observation_space.shape[0])).astype(np.float32)
    jobs = [
        [
            (
                f"job{j}/s{j}",
                0,
                obs[j, k],
                int(rng.integers(5)),
                0.1,
                -1.6,
                float(rng.normal()),
                k == 39,
                0.0,
                0,
            )
            for k in range(40)
        ]
        for j in range(2)
    ]
    interleaved = [t for pair in zip(*jobs, strict=True) for t in pair]
    weights = []
    for order in (interleaved, jobs[0] + jobs[1]):
        learner = OnlineLearner(
            PolicyStore({"default": bundle}),
            "default",
            tmp_path / f"v{len(weights)}",
            validate=lambda b: {"t": 1.0},
            config=LearnerConfig(update_every=16, window=4096, n_epochs=2, batch_size=32),
            rng=np.random.default_rng(0),
        )
        learner.add_transitions(order)
        model, _ = learner.update(bundle, learner.transitions())
        weights.append(torch.nn.utils.parameters_to_vector(model.policy.parameters()).detach())
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], torch.nn.utils.parameters_to_vector(bundle.model.policy.parameters()))


def test_the_replica_learner_clones_its_teacher_on_replicas_of_the_jobs_it_served(tmp_path):
    # mode=replica: a job's registration gives the learner its replica (GPU types, workload,
    # interval); an update runs DAgger there (the candidate acts, the bundle's teacher labels).
    from support import ROOT

    from dynamix_gym.controllers.bundle import load_bundle

    universal = load_bundle(ROOT / "results" / "policies" / "universal")
    scores = iter([100.0, 99.0])  # parent, candidate (a stub validator: the gate's logic alone)
    running = Running(universal, tmp_path / "t.jsonl", ServiceConfig(explore=True))
    learner = _attach(
        running, tmp_path, lambda b: {"t": next(scores)}, mode="replica", replica_episodes=2, replica_epochs=1
    )
    try:
        env = HeteroClusterEnv(workers=4, workload="ncf", action_mode="absolute")
        ctl = RemoteController(running.address, token=TOKEN, job_id="ncf-job", task="ncf4", timeout_s=10.0)
        run_episode(env, ctl, 0)
        ctl.close(final_report=env.unwrapped.last_report)
        (replica,) = learner.replicas
        assert replica["workload"] == "ncf" and replica["interval"] == 50
        assert sorted(replica["cluster"].gpu_types) == sorted(env.unwrapped.backend.spec.gpu_types)
        before = {k: v.clone() for k, v in universal.model.policy.state_dict().items()}
        entry = learner.step(force=True)
    finally:
        running.stop()
    assert entry["status"] == "promoted" and entry["mode"] == "replica"
    assert entry["update"]["replicas"] == 1 and entry["update"]["episodes"] == 2
    served = running.service.store.get("default")
    assert served.version == entry["version"]
    after = served.bundle.model.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the candidate was trained
    assert all(torch.equal(before[k], universal.model.policy.state_dict()[k]) for k in before)  # a copy


def test_replicas_come_in_the_same_order_whatever_order_jobs_registered_in(bundle, tmp_path):
    # each replica's collection seed is drawn in this order: concurrent registrations must not move it
    from types import SimpleNamespace

    specs = [
        SimpleNamespace(gpu_types=["T4", "V100"], workload="cifar10"),
        SimpleNamespace(gpu_types=["A100", "T4", "T4"], workload="ncf"),
        SimpleNamespace(gpu_types=["V100"] * 4, workload="bert"),
    ]
    orders = []
    for k, perm in enumerate(([0, 1, 2], [2, 0, 1], [1, 2, 0])):
        learner = OnlineLearner(
            PolicyStore({"default": bundle}),
            "default",
            tmp_path / f"v{k}",
            validate=lambda b: {"t": 1.0},
            config=LearnerConfig(mode="replica"),
        )
        for i in perm:
            assert learner.register(specs[i], 50)
        orders.append([(r["workload"], sorted(r["cluster"].gpu_types)) for r in learner.replicas])
    assert orders[0] == orders[1] == orders[2] and len(orders[0]) == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mode": "bc"}, r"learner\.mode must be one of"),
        ({"replica_episodes": 0}, r"learner\.replica_episodes must be >= 1"),
        ({"replica_learning_rate": 0.5}, r"learner.replica_learning_rate must lie in \(0, 0.01\]"),
        ({"rollback_test": "vote"}, r"learner\.rollback_test must be one of"),
        ({"rollback_alpha": 1.5}, r"learner\.rollback_alpha must lie in"),
        ({"rollback_gross": 0.01}, r"learner\.rollback_gross must exceed"),
    ],
)
def test_learner_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        LearnerConfig(**settings)
