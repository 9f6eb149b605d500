"""A fallback is never silent: refusals fail the job with their cause (or run loudly, by opt-in), a
lost service is warned of once and counted, and the service logs every refused call."""

from __future__ import annotations

import dataclasses
import logging

import grpc
import numpy as np
import pytest
from conftest import TOKEN, Running
from omegaconf import OmegaConf

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import arbitrator_pb2_grpc as pb_grpc
from dynamix_gym.service.client import ArbitratorClient, ArbitratorRefused, RemoteController
from dynamix_gym.service.messages import spec_to_proto

WRONG = "wrong-token-for-this-test-0123456789"
JOB = {"workers": 4, "scenario": "throttle"}


def _env() -> HeteroClusterEnv:
    return HeteroClusterEnv(**JOB, action_mode="absolute")


def _messages(caplog, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


def test_a_wrong_token_fails_the_job_naming_the_cause(running, caplog):
    ctl = RemoteController(running.address, token=WRONG, job_id="ddp-4", timeout_s=2.0)
    with pytest.raises(ArbitratorRefused) as e:
        run_episode(_env(), ctl, 0, max_steps=5)
    message = str(e.value)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "refused job 'ddp-4' (Register: UNAUTHENTICATED: missing or wrong token)" in message
    assert "DYNAMIX_ARBITRATOR_TOKEN" in message and "allow_without_policy=true" in message
    assert WRONG not in message and WRONG not in caplog.text  # the secret is never shown
    assert running.service.sessions() == 0 and running.service.stats["decisions"] == 0
    ctl.close()


def test_an_unknown_bundle_fails_the_job_naming_the_field(running):
    ctl = RemoteController(running.address, token=TOKEN, job_id="b1", bundle="nope", timeout_s=2.0)
    with pytest.raises(
        ArbitratorRefused, match=r"INVALID_ARGUMENT: bundle: unknown bundle 'nope'; served: \['default'\]"
    ):
        run_episode(_env(), ctl, 0, max_steps=5)
    ctl.close()


def test_opted_in_a_refused_job_runs_on_its_batches_and_counts_every_decision(running, caplog):
    ctl = RemoteController(
        running.address, token=WRONG, job_id="ddp-4", timeout_s=2.0, allow_without_policy=True
    )
    with caplog.at_level(logging.WARNING):
        result = run_episode(_env(), ctl, 0, max_steps=30)
    ctl.close()
    summary = result.summary
    assert summary["decisions"] == 30
    assert summary["decisions_without_policy"] == 30 == ctl.decisions_without_policy
    assert summary["batch_changes"] == 0
    flags = [row["without_policy"] for row in result.timeline]
    assert flags == [False] + [True] * 30  # the reset row ran no decision
    assert ctl.client.counts["error_unauthenticated"] == 1  # refused once, never asked again
    errors = _messages(caplog, "dynamix_gym.service.client", logging.ERROR)
    assert len(errors) == 1 and "TRAINING GOES ON WITHOUT THE POLICY" in errors[0]
    assert "UNAUTHENTICATED" in errors[0] and WRONG not in caplog.text


class StopsTheService:
    """A RemoteController whose service is stopped before its ``at``-th decision."""

    def __init__(self, inner: RemoteController, running: Running, at: int) -> None:
        self.inner, self.running, self.at, self.calls = inner, running, at, 0
        self.name, self.action_mode, self.uses_truth = inner.name, inner.action_mode, inner.uses_truth

    def reset(self, spec, rng=None) -> None:
        self.inner.reset(spec, rng)

    def predict(self, obs, info, deterministic: bool = True):
        if self.calls == self.at:
            self.running.stop()
        self.calls += 1
        return self.inner.predict(obs, info, deterministic)

    @property
    def last_without_policy(self) -> bool:
        return self.inner.last_without_policy


def test_a_service_lost_mid_run_is_warned_of_once_and_its_decisions_counted(bundle, tmp_path, caplog):
    running = Running(bundle, tmp_path / "t.jsonl")
    inner = RemoteController(running.address, token=TOKEN, job_id="lost", timeout_s=1.0, backoff_s=0.05)
    ctl = StopsTheService(inner, running, at=10)
    env = HeteroClusterEnv(workers=6, scenario="static_hetero", workload="ncf", action_mode="absolute")
    try:
        with caplog.at_level(logging.WARNING):
            result = run_episode(env, ctl, 101, max_steps=40)
    finally:
        running.stop()
        inner.close()
    summary, timeline = result.summary, result.timeline
    assert summary["decisions"] == 40 and inner.client.counts["decisions"] == 10
    assert summary["decisions_without_policy"] == 30 == inner.decisions_without_policy
    assert [row["without_policy"] for row in timeline] == [False] * 11 + [True] * 30
    batches = [tuple(row[f"w{i}_batch"] for i in range(6)) for row in timeline]
    assert len(set(batches[10:])) == 1  # from the service's last decision on, the batches are kept
    assert len(set(batches[:11])) > 1  # while it answered, it changed them
    warnings = _messages(caplog, "dynamix_gym.service.client", logging.WARNING)
    assert len(warnings) == 1 and "did not answer job 'lost' (UNAVAILABLE" in warnings[0]
    assert inner.client.counts["outages"] == 1
    assert not _messages(caplog, "dynamix_gym.service.client", logging.ERROR)  # not a refusal


def _register(address: str, token: str, job_id: str = "ddp-4", bundle: str = "") -> pb.RegisterReply:
    env = _env()
    req = pb.RegisterRequest(
        job_id=job_id, schema_version="1", spec=spec_to_proto(env.backend.spec), interval=50, bundle=bundle
    )
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ArbitratorStub(channel).Register(
            req, timeout=2.0, metadata=(("authorization", f"Bearer {token}"),)
        )


def test_the_service_logs_every_refused_call_with_cause_peer_and_job_never_the_token(running, caplog):
    logger = "dynamix_gym.service.transport"
    with caplog.at_level(logging.WARNING, logger=logger):
        with pytest.raises(grpc.RpcError):
            _register(running.address, WRONG)
        with pytest.raises(grpc.RpcError):
            _register(running.address, TOKEN, job_id="b2", bundle="nope")
        # a live job whose token no longer matches: its report names the job that holds the session
        session = _register(running.address, TOKEN, job_id="live").session_id
        with grpc.insecure_channel(running.address) as channel, pytest.raises(grpc.RpcError):
            pb_grpc.ArbitratorStub(channel).Close(
                pb.CloseRequest(session_id=session), timeout=2.0, metadata=(("authorization", "Bearer x"),)
            )
    lines = _messages(caplog, logger, logging.WARNING)
    assert len(lines) == 3
    wrong, bundle, close = lines
    assert wrong.startswith("refused Register from ipv4:127.0.0.1:")
    assert "(job 'ddp-4'): UNAUTHENTICATED: missing or wrong token" in wrong
    assert "(job 'b2'): INVALID_ARGUMENT: bundle: unknown bundle 'nope'" in bundle
    assert close.startswith("refused Close from ipv4:127.0.0.1:") and "(job 'live'): UNAUTHENTICATED" in close
    assert WRONG not in caplog.text and TOKEN not in caplog.text
    assert running.service.stats["refused_unauthenticated"] == 2
    assert running.service.stats["refused_invalid_argument"] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, r"timeout_s must lie in \(0, 60\] seconds, got 0"),
        ({"timeout_s": float("nan")}, r"timeout_s must lie in \(0, 60\] seconds, got nan"),
        ({"timeout_s": 600}, r"timeout_s must lie in \(0, 60\] seconds, got 600"),
        ({"backoff_s": -1}, r"backoff_s must lie in \(0, 3600\] seconds, got -1"),
        ({"backoff_s": 5.0, "max_backoff_s": 1.0}, r"backoff_s must be <= max_backoff_s \(1.0\), got 5.0"),
        ({"job_id": "a b"}, r"job_id must be 1-64 characters of \[A-Za-z0-9._-\], got 'a b'"),
        ({"allow_without_policy": "yes"}, "allow_without_policy must be true or false, got 'yes'"),
    ],
)
def test_bad_client_settings_are_refused_naming_the_field_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArbitratorClient("127.0.0.1:50051", token=TOKEN, **kwargs)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":50051", "host:port"])
def test_a_malformed_address_is_refused_naming_the_form(address):
    with pytest.raises(ValueError, match=r"host:port with a port in \[1, 65535\]"):
        RemoteController(address, token=TOKEN)


def test_deploy_refuses_unknown_arbitrator_settings_naming_them(monkeypatch):
    from experiments.deploy import build_controller

    monkeypatch.setenv("DYNAMIX_ARBITRATOR_TOKEN", TOKEN)

    cfg = OmegaConf.create(
        {"arbitrator": "127.0.0.1:50051", "env": {"interval": 10}, "arbitrator_kwargs": {"timeout": 1.0}}
    )
    with pytest.raises(ValueError, match=r"arbitrator_kwargs \['timeout'\] unknown; the client takes \["):
        build_controller(cfg)
    cfg.arbitrator_kwargs = {"token_file": None, "allow_without_policy": True, "job_id": "ddp-4"}
    ctl = build_controller(cfg)
    assert ctl.client.allow_without_policy and ctl.client.job_id == "ddp-4"
    ctl.close()


def test_a_missing_token_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"token_file .*absent\.txt' does not exist"):
        ArbitratorClient("127.0.0.1:50051", token_file=tmp_path / "absent.txt")


def test_in_process_controllers_never_decide_without_their_policy():
    from dynamix_gym.controllers.registry import make_controller

    ctl = make_controller("dlb")
    env = HeteroClusterEnv(**JOB, action_mode=ctl.action_mode)
    result = run_episode(env, ctl, 0, max_steps=5)
    assert result.summary["decisions_without_policy"] == 0
    assert not any(row["without_policy"] for row in result.timeline)
    assert np.isfinite(result.summary["decision_time_ms"])


def test_a_job_the_service_ended_trains_on_alone_and_says_so_once(running, caplog):
    env = _env()
    _obs, info = env.reset(seed=3)
    client = ArbitratorClient(running.address, token=TOKEN, job_id="past-target", timeout_s=2.0)
    client.register(env.backend.spec, env.interval)
    done = dataclasses.replace(info["report"], val_accuracy=1.0)  # the service ends the job here
    assert client.decide(done, env.unwrapped.batches) is not None
    with caplog.at_level(logging.WARNING, logger="dynamix_gym.service.client"):
        kept = [client.decide(info["report"], env.unwrapped.batches) for _ in range(3)]
    assert kept == [None, None, None] and client.decisions_without_policy == 3
    assert client.counts["error_out_of_range"] == 1  # asked once, then decides alone
    warnings = _messages(caplog, "dynamix_gym.service.client", logging.WARNING)
    assert len(warnings) == 1 and "the job has ended (its target or time budget was reached)" in warnings[0]
    client.close()
