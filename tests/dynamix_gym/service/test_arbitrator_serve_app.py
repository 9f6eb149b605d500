"""python -m experiments.serve: its refusals, and a SIGKILL mid-run (the real process)."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from conftest import TOKEN
from hydra import compose, initialize_config_dir
from support import ROOT

from dynamix_gym.benchmark.validation import make_validator
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.service.client import ArbitratorClient
from dynamix_gym.service.server import ArbitratorService, PolicyStore
from dynamix_gym.service.translog import read_log
from dynamix_gym.service.transport import build_server, load_token
from experiments.bench_serve import ServiceProcess
from experiments.serve import serve


def _cfg(*overrides: str):
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        return compose("serve", overrides=list(overrides))


def test_a_token_on_the_command_line_is_refused(tmp_path):
    with pytest.raises(ValueError, match="never give the token on the command line"):
        serve(_cfg("+token=abcdefghijklmnopqrstuvwxyz"), out_dir=tmp_path)


def test_tokens_come_from_a_file_or_the_environment_and_must_be_long(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    assert load_token(f, None) == TOKEN
    assert load_token(None, "T", environ={"T": TOKEN}) == TOKEN
    with pytest.raises(ValueError, match="at least 16 printable characters"):
        load_token(None, "T", environ={"T": "short"})
    with pytest.raises(ValueError, match="needs a token"):
        load_token(None, None)
    with pytest.raises(ValueError, match="does not exist"):
        load_token(tmp_path / "missing", None)


def test_a_public_address_without_tls_is_refused(bundle, tmp_path):
    service = ArbitratorService(PolicyStore({"d": bundle}), tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match="not a loopback address: configure TLS"):
        build_server(service, TOKEN, host="0.0.0.0")
    with pytest.raises(ValueError, match="TLS needs both cert_file and key_file"):
        build_server(service, TOKEN, cert_file="x.pem")
    service.close()


def test_validation_never_uses_the_test_split_or_its_seeds():
    with pytest.raises(ValueError, match="test split is for scoring only"):
        make_validator({"split": "test"})
    with pytest.raises(ValueError, match="seeds must be >= 100"):
        make_validator({"split": "train", "tasks": ["cifar10_t4v100_static"], "seeds": [0]})


@pytest.mark.slow  # two service start-ups
@pytest.mark.integration
def test_service_killed_mid_run_restarts_and_the_job_trains_on(tmp_path):
    svc = ServiceProcess("results/headline/policy", tmp_path, TOKEN)
    svc.start()
    env = HeteroClusterEnv(workers=4, workload="ncf", action_mode="absolute")  # ~100 decisions
    _, info = env.reset(seed=100)
    client = ArbitratorClient(
        svc.address, token=TOKEN, job_id="kill-me", timeout_s=2.0, backoff_s=0.05, max_backoff_s=0.5
    )
    client.register(env.backend.spec, env.interval)
    received = {}
    try:
        after = 0
        for step in range(80):  # bounded; stops once 10 decisions came after the restart
            if after >= 10:
                break
            if step == 10:
                svc.proc.send_signal(signal.SIGKILL)
                svc.proc.wait(10)
            if step == 14:
                svc.start()  # same port, same log
            new = client.decide(info["report"], env.unwrapped.batches)
            if new is not None:
                received[client.seq - 1] = new.tolist()
                after += step >= 14
            elif step >= 14:
                time.sleep(0.2)
            action = env.unwrapped.batches if new is None else new
            _, _, term, trunc, info = env.step(action.astype(np.float32))
            assert not (term or trunc)
    finally:
        svc.stop()
    logged = {r["seq"]: r for r in read_log(tmp_path / "transitions.jsonl") if r["kind"] == "decision"}
    assert after == 10 and len(received) >= 20 and client.counts["registers"] >= 2
    assert set(received) <= set(logged)  # every decision a client got was logged first
    assert len(set(logged) - set(received)) <= 1  # at most the one in flight at the kill


def test_bundles_the_service_cannot_drive_are_refused(bundle):
    from dataclasses import replace

    from dynamix_gym.controllers.bundle import BundleMismatchError, PolicyBundle

    meta = replace(bundle.meta)
    meta.action_mode = "continuous"  # past BundleMeta's own check: the store checks again
    continuous = PolicyBundle(bundle.path, meta, bundle.model, bundle.obs_norm)
    with pytest.raises(BundleMismatchError, match="serves the discrete modes"):
        PolicyStore({"c": continuous})


@pytest.mark.integration
def test_serve_with_learning_starts_listens_and_stops_by_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNAMIX_ARBITRATOR_TOKEN", TOKEN)
    stats = serve(_cfg("learn=true", "port=0", "max_runtime_s=1.0", f"log_dir={tmp_path}"), out_dir=tmp_path)
    assert stats == {} or "decisions" not in stats
    assert (tmp_path / "endpoint.json").exists() and (tmp_path / "stats.json").exists()
    lineage = (tmp_path / "versions" / "lineage.json").read_text()
    assert '"status": "promoted"' in lineage  # version 0, the pretrained bundle


@pytest.mark.slow  # a service start-up and the start of an update
@pytest.mark.integration
def test_a_service_stopped_during_an_update_exits_and_leaves_no_child(tmp_path):
    """SIGTERM while the learner's child trains: the service stops at once and takes its child with
    it; the child ran idle-scheduled and niced (``learner.worker=process``, the default)."""
    import os

    import psutil

    svc = ServiceProcess(
        "results/policies/universal", tmp_path, TOKEN, extra=["learn=true", "learner.update_every=16"]
    )
    svc.start()
    try:
        env = HeteroClusterEnv(workers=4, workload="cifar10", action_mode="absolute")
        _, info = env.reset(seed=100)
        client = ArbitratorClient(svc.address, token=TOKEN, job_id="learn-me", timeout_s=2.0)
        client.register(env.backend.spec, env.interval)
        for _ in range(24):  # past update_every: the learner starts an update
            new = client.decide(info["report"], env.unwrapped.batches)
            action = env.unwrapped.batches if new is None else new
            _, _, term, trunc, info = env.step(action.astype(np.float32))
            assert not (term or trunc)
        service = psutil.Process(svc.proc.pid)
        deadline, learner = time.monotonic() + 60.0, []
        while time.monotonic() < deadline and not learner:
            learner = [k for k in service.children() if "spawn_main" in " ".join(k.cmdline())]
            time.sleep(0.2)
        assert learner, "no update started in a child"
        child = learner[0]
        while time.time() - child.create_time() < 1.0 and os.sched_getscheduler(child.pid) != os.SCHED_IDLE:
            time.sleep(0.01)
        # set by the service as the child starts, before the child's start-up imports run
        assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE and child.nice() >= 10
        kids = service.children(recursive=True)
        t0 = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(30) == 0 and time.monotonic() - t0 < 30
        _gone, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, f"left behind: {[k.pid for k in alive]}"
    finally:
        svc.stop()
