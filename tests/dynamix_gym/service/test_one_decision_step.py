"""One bundle, three consumers of the one decision step (dynamix_gym.decision): the env through the
bundle controller, the arbitrator service over gRPC and the torchrun drop-in's rank-0 decision
decide the same batches on the same interval reports."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from conftest import TOKEN, Running
from support import UNIVERSAL_BUNDLE

from adapters.dropin import DropInDecider
from dynamix_gym.controllers.bundle import PPOController, load_bundle
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.service.client import ArbitratorClient
from sim.guards import Guard

JOB = {"workers": 4, "scenario": "mixed", "max_decisions": 25}


@pytest.fixture(scope="module")
def universal():
    return load_bundle(UNIVERSAL_BUNDLE)


@pytest.fixture(scope="module")
def episode(universal):
    """The env's episode under the bundle controller: every report, and the batches it decided
    after each (the last report ends the episode: no decision follows it)."""
    ctl = PPOController(bundle=universal)
    env = HeteroClusterEnv(**JOB, action_mode=ctl.action_mode, **ctl.env_options())
    ctl.check_env(env)
    obs, info = env.reset(seed=7)
    ctl.reset(env.backend.spec, np.random.default_rng(7))
    reports, decided = [info["report"]], []
    done = False
    while not done:
        action, _ = ctl.predict(obs, info)
        obs, _, terminated, truncated, info = env.step(action)
        decided.append(info["local_batches"].tolist())
        reports.append(info["report"])
        done = terminated or truncated
    env.close()
    return env, reports, decided


def _drop_in(policy, env, reports) -> tuple[list[list[int]], Guard]:
    """The drop-in's rank-0 decisions replayed on ``reports`` (its own batches in force)."""
    guard = Guard()  # the drop-in's default guards
    decider = DropInDecider(env.backend.spec, guard, policy)
    batches, out = reports[0].local_batch.astype(np.int64), []
    for i, report in enumerate(reports[:-1]):
        batches, _stop, _verdict = decider.decide(report, batches, i)
        out.append(batches.tolist())
    return out, guard


def _served(universal, env, reports, log_path) -> list[list[int]]:
    """The service's decisions on ``reports`` (in-process gRPC on 127.0.0.1, with a token)."""
    running = Running(universal, log_path)
    try:
        client = ArbitratorClient(running.address, token=TOKEN, job_id="one-step", timeout_s=5.0)
        client.register(env.backend.spec, env.interval)
        current, out = reports[0].local_batch.astype(np.int64), []
        for report in reports[:-1]:
            current = client.decide(report, current)
            assert current is not None, client.last_error
            out.append(current.tolist())
        client.close()
    finally:
        running.stop()
    return out


def test_env_service_and_drop_in_decide_the_same_batches(universal, episode, tmp_path):
    env, reports, from_env = episode
    meta = universal.meta
    assert (meta.action_mode, meta.algorithm, meta.split) == ("scale", "maskable_ppo", "balanced_cost")
    assert len(from_env) >= 10
    changes = sum(a != b for a, b in itertools.pairwise(from_env))
    assert 0 < changes < len(from_env) - 1  # the policy moves the batches, and the split keeps some
    from_service = _served(universal, env, reports, tmp_path / "t.jsonl")
    from_drop_in, guard = _drop_in(
        make_controller(str(UNIVERSAL_BUNDLE)), env, reports
    )  # as the drop-in loads it
    assert not guard.events  # a healthy run: the guards watched and never took control
    assert from_service == from_env
    assert from_drop_in == from_env


def test_a_consumer_with_another_split_tolerance_decides_otherwise(universal, episode):
    """The comparison above can fail: the drop-in under a perturbed split tolerance (the bundle
    as trained otherwise) departs from the env's batches."""
    env, reports, from_env = episode
    same, _ = _drop_in(PPOController(bundle=universal), env, reports)
    assert same == from_env
    tolerance = universal.meta.split_tolerance + 0.2
    perturbed = dataclasses.replace(
        universal, meta=dataclasses.replace(universal.meta, split_tolerance=tolerance)
    )
    other, _ = _drop_in(PPOController(bundle=perturbed), env, reports)
    assert other != from_env
