"""The arbitrator on localhost: two real jobs, the fallback when it is down, restarts, tokens."""

from __future__ import annotations

import dataclasses
import time

import grpc
import numpy as np
import pytest
from conftest import TOKEN, Running, run_in_threads
from support import UNIVERSAL_BUNDLE

from dynamix_gym.controllers.bundle import PPOController, load_bundle
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import arbitrator_pb2_grpc as pb_grpc
from dynamix_gym.service.client import ArbitratorClient, ArbitratorRefused, RemoteController
from dynamix_gym.service.messages import spec_to_proto
from dynamix_gym.service.translog import read_log

JOBS = [
    {"workers": 4, "scenario": "throttle", "seed": 100},
    {"workers": 6, "scenario": "static_hetero", "workload": "ncf", "seed": 101},
]


def _env(job, mode):
    kw = {k: v for k, v in job.items() if k != "seed"}
    return HeteroClusterEnv(**kw, action_mode=mode)


def test_two_jobs_against_the_service_decide_as_the_policy_in_process(running, bundle):
    def remote(i, job):
        ctl = RemoteController(running.address, token=TOKEN, job_id=f"job{i}", timeout_s=5.0)
        env = _env(job, "absolute")
        summary = run_episode(env, ctl, job["seed"]).summary
        ctl.close(final_report=env.unwrapped.last_report)
        return summary, dict(ctl.client.counts)

    results = run_in_threads([lambda i=i, j=j: remote(i, j) for i, j in enumerate(JOBS)])
    for job, (summary, counts) in zip(JOBS, results, strict=True):
        local = run_episode(_env(job, "delta"), PPOController(bundle=bundle), job["seed"]).summary
        assert summary["reached_target"]
        assert summary["time_to_accuracy_s"] == local["time_to_accuracy_s"]  # the very same decisions
        assert counts["decisions"] == summary["decisions"] and counts["fallbacks"] == 0
    records = list(read_log(running.log_path))
    for i, (summary, _) in enumerate(results):
        seqs = [r["seq"] for r in records if r["kind"] == "decision" and r["job"] == f"job{i}"]
        assert seqs == list(range(summary["decisions"]))  # none dropped, none duplicated
        ends = [r for r in records if r["kind"] == "end" and r["job"] == f"job{i}"]
        assert len(ends) == 1 and ends[0]["reached"]
    assert running.service.stats["decisions"] == sum(s["decisions"] for s, _ in results)


@pytest.mark.parametrize("split", ["policy", "balanced", "balanced_cost"])
def test_a_masked_scale_bundle_is_served_as_it_acts_in_process(tmp_path, split):
    """The universal bundle (schema 3, masked multiplicative steps) through the service: the same
    decisions as in process, the reply names its steps, and every logged decision carries its mask.
    Under the balanced split too: the service shares the global batch as the env does."""
    universal = load_bundle(UNIVERSAL_BUNDLE)
    universal = dataclasses.replace(universal, meta=dataclasses.replace(universal.meta, split=split))
    meta = universal.meta
    assert (meta.action_mode, meta.algorithm, meta.schema_version) == ("scale", "maskable_ppo", "3")
    job = {"workers": 4, "workload": "ncf", "scenario": "throttle"}
    running = Running(universal, tmp_path / "t.jsonl")
    try:
        ctl = RemoteController(running.address, token=TOKEN, job_id="u0", timeout_s=5.0)
        env = HeteroClusterEnv(**job, action_mode="absolute")
        remote = run_episode(env, ctl, 7).summary
        ctl.close(final_report=env.unwrapped.last_report)
    finally:
        running.stop()
    assert (ctl.client.action_mode, ctl.client.action_steps) == ("scale", list(meta.action_set))
    in_process = PPOController(bundle=universal)
    local_env = HeteroClusterEnv(**job, action_mode="scale", **in_process.env_options())
    assert local_env.split == split
    local = run_episode(local_env, in_process, 7).summary
    assert remote["reached_target"] and remote["batch_changes"] > 0
    assert remote["time_to_accuracy_s"] == local["time_to_accuracy_s"]
    decisions = [r for r in read_log(running.log_path) if r["kind"] == "decision"]
    assert len(decisions) == remote["decisions"]
    for r in decisions:
        mask = np.asarray(r["mask"], dtype=bool)
        assert mask.shape == (4, len(meta.action_set))
        assert mask[np.arange(4), r["action"]].all()  # the chosen steps are legal ones
    assert any(not np.asarray(r["mask"], dtype=bool).all() for r in decisions)  # a bound was in play


def test_the_service_reports_the_inputs_a_job_reads_out_of_range_as_the_controller_does(tmp_path, caplog):
    """The universal bundle on the LM campaign's refit reads its progress gain far out of range (as
    PPOController reports in-process): each decision record lists the inputs out at it, and the job's
    end record totals them exactly as the in-process summary does; the service warns of those out at
    half the decisions or more."""
    from dynamix_gym.service.server import ServiceConfig
    from sim.profile import load_profile

    universal = load_bundle(UNIVERSAL_BUNDLE)
    job = dict(profile=load_profile("results/deploy/lm_11/profile_refit"), scenario="static_hetero",
               initial_batch=32, interval=20)  # fmt: skip
    running = Running(universal, tmp_path / "t.jsonl", ServiceConfig(out_of_range_sd=3.0))
    try:
        ctl = RemoteController(running.address, token=TOKEN, job_id="lm", timeout_s=5.0)
        env = HeteroClusterEnv(**job, action_mode="absolute")
        with caplog.at_level("WARNING", logger="dynamix_gym.service.server"):
            remote = run_episode(env, ctl, 0).summary
            ctl.close(final_report=env.unwrapped.last_report)  # the job's end record
    finally:
        running.stop()
    in_process = PPOController(bundle=universal, out_of_range_sd=3.0)
    local = run_episode(
        HeteroClusterEnv(**job, action_mode="scale", **in_process.env_options()), in_process, 0
    )
    records = list(read_log(running.log_path))
    (end,) = [r for r in records if r["kind"] == "end"]
    decisions = [r for r in records if r["kind"] == "decision"]
    assert remote["time_to_accuracy_s"] == local.summary["time_to_accuracy_s"]
    assert end["inputs_out_of_range"] == local.summary["inputs_out_of_range"]
    assert end["inputs_out_of_range"].startswith("global.progress_gain (")
    hits = sum("global.progress_gain" in r["out_of_range"] for r in decisions)
    assert f"global.progress_gain ({hits} of {len(decisions)})" in end["inputs_out_of_range"]
    # the warning names the inputs out at half the decisions or more (at 3 s.d., some are here)
    mostly = [
        e
        for e in end["inputs_out_of_range"].split("; ")
        if 2 * int(e.split(" (")[1].split(" ")[0]) >= len(decisions)
    ]
    (warned,) = [m for m in caplog.messages if m.startswith("job lm: bundle default read inputs 3+")]
    assert mostly and warned.endswith(f"{', '.join(mostly)}; the policy extrapolates on this job")


def test_training_goes_on_at_its_batches_when_the_service_is_down():
    job = JOBS[0]
    env = _env(job, "absolute")
    # Nothing listens on this port (bound by nobody: taken from a closed listener).
    ctl = RemoteController("127.0.0.1:9", token=TOKEN, job_id="lonely", timeout_s=0.2, backoff_s=0.05)
    t0 = time.perf_counter()
    result = run_episode(env, ctl, job["seed"], max_steps=40)
    elapsed = time.perf_counter() - t0
    counts = ctl.client.counts
    assert counts["decisions"] == 0 and counts["fallbacks"] == result.summary["decisions"] == 40
    batches = {tuple(row["local_batches"]) for row in result.timeline if "local_batches" in row}
    assert len(batches) <= 1  # the initial batches throughout
    assert result.summary["batch_changes"] == 0
    assert elapsed < 40 * 0.2 + 5.0  # every call bounded by its deadline; back-off skips most calls
    attempts = sum(v for k, v in counts.items() if k.startswith("error_"))
    assert attempts < 40
    ctl.close()


def test_restart_mid_run_reconnects_and_keeps_the_log(bundle, tmp_path):
    log_path = tmp_path / "transitions.jsonl"
    running = Running(bundle, log_path)
    job = JOBS[1]  # ncf: an episode longer than the test
    env = _env(job, "absolute")
    client = ArbitratorClient(
        running.address, token=TOKEN, job_id="survivor", timeout_s=1.0, backoff_s=0.02, max_backoff_s=0.1
    )
    _, info = env.reset(seed=job["seed"])
    client.register(env.backend.spec, env.interval)
    got = []
    for step in range(200):  # bounded; stops after 10 decisions from the restarted service
        if step == 10:
            running.stop()  # the service goes away ...
        if step == 15:
            running.start()  # ... and comes back on the same port, appending to the same log
        if sum(got[15:]) >= 10:
            break
        if step >= 15:
            time.sleep(0.02)  # let the channel reconnect (its back-off is short)
        new = client.decide(info["report"], env.unwrapped.batches)
        got.append(new is not None)
        action = env.unwrapped.batches if new is None else new
        _obs, _, term, trunc, info = env.step(action.astype(np.float32))
        assert not (term or trunc)
    running.stop()
    assert all(got[:10]) and not any(got[10:15]) and sum(got[15:]) >= 10
    assert client.counts["registers"] >= 2  # registered again with the restarted service
    seqs = [r["seq"] for r in read_log(log_path) if r["kind"] == "decision"]
    assert seqs == sorted(set(seqs))  # append-only, one decision per seq across the restart
    assert len(seqs) == client.counts["decisions"] + client.counts["replayed"]


def test_a_retried_seq_gets_the_same_decision_not_a_new_one(running):
    env = _env(JOBS[0], "absolute")
    _obs, info = env.reset(seed=1)
    client = ArbitratorClient(running.address, token=TOKEN, job_id="retry", timeout_s=2.0)
    client.register(env.backend.spec, env.interval)
    first = client.decide(info["report"], env.unwrapped.batches)
    client.seq -= 1  # as if the answer had been lost: the job resends the same seq
    again = client.decide(info["report"], env.unwrapped.batches)
    np.testing.assert_array_equal(first, again)
    assert client.counts == {**client.counts, "decisions": 1, "replayed": 1}
    assert running.service.stats["decisions"] == 1
    client.seq += 5  # a gap is refused, not silently accepted: the job fails naming it
    with pytest.raises(
        ArbitratorRefused, match=r"FAILED_PRECONDITION: seq: expected 1 \(or 0 to retry\), got 6"
    ):
        client.decide(info["report"], env.unwrapped.batches)
    assert client.last_error.startswith("FAILED_PRECONDITION: seq: expected 1")


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789", TOKEN + "x", ""])
def test_calls_without_the_right_token_are_refused(running, token):
    env = _env(JOBS[0], "absolute")
    channel = grpc.insecure_channel(running.address)
    stub = pb_grpc.ArbitratorStub(channel)
    req = pb.RegisterRequest(
        job_id="x", schema_version="1", spec=spec_to_proto(env.backend.spec), interval=50
    )
    md = None if token is None else (("authorization", f"Bearer {token}"),)
    with pytest.raises(grpc.RpcError) as e:
        stub.Register(req, timeout=2.0, metadata=md)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert running.service.sessions() == 0
    ok = stub.Register(req, timeout=2.0, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert ok.session_id and running.service.sessions() == 1
    channel.close()


def test_schema_mismatch_is_refused_with_a_clear_error(running):
    env = _env(JOBS[0], "absolute")
    channel = grpc.insecure_channel(running.address)
    stub = pb_grpc.ArbitratorStub(channel)
    req = pb.RegisterRequest(
        job_id="x", schema_version="0", spec=spec_to_proto(env.backend.spec), interval=50
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.Register(req, timeout=2.0, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "schema_version: the service encodes observation schemas ['1', '2', '3', '4']" in e.value.details()
    channel.close()


def test_a_restarted_service_never_reissues_a_session_id_of_the_killed_one(bundle, tmp_path):
    """Regression: ids drawn from the seeded generator repeated after a restart, so a job still
    holding the killed service's id was served as another job (found by bench_serve's kill stage)."""
    running = Running(bundle, tmp_path / "t.jsonl")
    env4, env6 = _env(JOBS[0], "absolute"), _env(JOBS[1], "absolute")
    _, info4 = env4.reset(seed=1)
    env6.reset(seed=2)
    old = ArbitratorClient(running.address, token=TOKEN, job_id="old", timeout_s=2.0, backoff_s=0.01)
    old.register(env4.backend.spec, env4.interval)
    assert old.decide(info4["report"], env4.unwrapped.batches) is not None
    held = old.session
    running.stop()
    running.start()  # the same seed
    new = ArbitratorClient(running.address, token=TOKEN, job_id="new", timeout_s=2.0)
    new.register(env6.backend.spec, env6.interval)
    assert new.session != held
    got = None
    for _ in range(50):  # bounded: the old job re-registers once the channel is back
        got = old.decide(info4["report"], env4.unwrapped.batches)
        if got is not None:
            break
        time.sleep(0.05)
    running.stop()
    assert got is not None and got.shape == (4,) and old.session != held
    assert old.counts["registers"] == 2


def test_a_job_registers_the_schema_its_policy_reads_and_a_mismatch_is_refused(running):
    """The headline bundle reads schema 1: a job that names it registers, one that needs schema 3
    is refused by name, and one that names none learns the bundle's schema from the reply."""
    spec = _env(JOBS[0], "absolute").backend.spec
    named = ArbitratorClient(running.address, token=TOKEN, job_id="s1", obs_schema=1, timeout_s=2.0)
    assert named.register(spec, 50) and named.schema_version == "1"
    unnamed = ArbitratorClient(running.address, token=TOKEN, job_id="s0", timeout_s=2.0)
    assert unnamed.register(spec, 50) and unnamed.schema_version == "1"
    other = ArbitratorClient(running.address, token=TOKEN, job_id="s3", obs_schema="3", timeout_s=2.0)
    with pytest.raises(
        ArbitratorRefused, match="FAILED_PRECONDITION: bundle 'default' reads observation schema 1"
    ):
        other.register(spec, 50)  # a refusal: the job fails naming it
    assert other.schema_version is None
    assert other.last_error.startswith("FAILED_PRECONDITION: bundle 'default' reads observation schema 1")
    with pytest.raises(ValueError, match=r"obs_schema must be one of \['1', '2', '3', '4'\]"):
        ArbitratorClient(running.address, token=TOKEN, obs_schema=5)


def test_a_schema4_bundle_needs_the_jobs_compute_curve_in_its_registration(tmp_path):
    """Schema 4 reads each worker's compute curve: a job that registers none is refused by name when
    it registers (not at its first decision); one that registers it is served exactly as in-process."""
    from sb3_contrib import MaskablePPO

    from dynamix_gym.controllers.bundle import BundleMeta, save_bundle
    from dynamix_gym.envs.vec_env import PerWorkerVecEnv

    steps = [0.5, 1.0, 2.0]
    job = dict(workers=3, scenario="throttle", max_decisions=6)
    make = lambda: HeteroClusterEnv(**job, obs_schema=4, action_mode="scale", action_set=steps)  # noqa: E731
    model = MaskablePPO("MlpPolicy", PerWorkerVecEnv([make]), n_steps=8, batch_size=8, seed=0, device="cpu")
    meta = BundleMeta(obs_form="per_worker", action_set=steps, action_mode="scale", algorithm="maskable_ppo",
                      schema_version="4")  # fmt: skip
    bundle = load_bundle(save_bundle(tmp_path / "b4", model, meta, None))
    served = Running(bundle, tmp_path / "t.jsonl")
    try:
        spec = make().backend.spec
        client = ArbitratorClient(served.address, token=TOKEN, job_id="s4", timeout_s=2.0)
        with pytest.raises(
            ArbitratorRefused, match=r"FAILED_PRECONDITION: bundle 'default' reads observation schema 4"
        ):
            client.register(dataclasses.replace(spec, compute_curve_s=None), 50)
        assert "the job registered none: register spec.compute_curve_s" in client.last_error
        ctl = RemoteController(served.address, token=TOKEN, job_id="s4c", timeout_s=5.0)
        env = HeteroClusterEnv(**job, action_mode="absolute")
        remote = run_episode(env, ctl, 3).summary
        ctl.close(final_report=env.unwrapped.last_report)
    finally:
        served.stop()
    in_process = PPOController(bundle=bundle)
    local = run_episode(
        HeteroClusterEnv(**job, action_mode="scale", **in_process.env_options()), in_process, 3
    )
    assert remote["decisions"] == local.summary["decisions"] == 6 and remote["batch_changes"] > 0
    assert remote["total_time_s"] == local.summary["total_time_s"]


def test_a_job_that_misses_its_target_is_scored_by_its_time_budget(running):
    """The service's end record (what the learner's rollback test measures) scores a miss as the
    benchmark does (dynamix_gym.benchmark.scoring.run_score_s): the time budget, not the time used."""
    env = HeteroClusterEnv(workers=4, scenario="throttle", time_budget_s=120.0, action_mode="absolute")
    ctl = RemoteController(running.address, token=TOKEN, job_id="late", timeout_s=5.0)
    summary = run_episode(env, ctl, 3).summary
    ctl.close(final_report=env.unwrapped.last_report)
    assert not summary["reached_target"] and summary["total_time_s"] > 120.0
    ends = [r for r in read_log(running.log_path) if r["kind"] == "end"]
    assert len(ends) == 1 and not ends[0]["reached"]
    assert ends[0]["tta_s"] == 120.0
