"""A fuzzed stream of malformed and hostile requests gets only refusals, and poisons nothing."""

from __future__ import annotations

from collections import Counter

import grpc
import numpy as np
from conftest import TOKEN

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import fuzz
from dynamix_gym.service.client import ArbitratorClient
from dynamix_gym.service.messages import report_to_proto, spec_to_proto
from dynamix_gym.service.translog import read_log

#: What a refusal may be: the service's own codes, and gRPC's for undecodable or oversized bytes.
REFUSALS = {"INVALID_ARGUMENT", "UNAUTHENTICATED", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}


class SpyLearner:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def observe(self, record: dict) -> None:
        self.records.append(record)

    def job_end(self, record: dict) -> None:
        self.records.append(record)


def test_fuzzed_requests_are_refused_and_the_service_keeps_serving(running):
    spy = SpyLearner()
    running.service.learner = spy
    env = HeteroClusterEnv(workers=4, scenario="throttle", action_mode="absolute")
    _, info = env.reset(seed=5)
    client = ArbitratorClient(running.address, token=TOKEN, job_id="legit", timeout_s=2.0)
    client.register(env.backend.spec, env.interval)
    assert client.decide(info["report"], env.unwrapped.batches) is not None
    register = pb.RegisterRequest(
        job_id="fuzzer", schema_version="1", spec=spec_to_proto(env.backend.spec), interval=50
    )
    report = pb.ReportRequest(
        session_id=client.session,
        seq=client.seq,
        report=report_to_proto(info["report"]),
        current_batch=env.unwrapped.batches.tolist(),
    )
    channel = grpc.insecure_channel(running.address)
    codes = fuzz.run(
        channel, fuzz.cases(np.random.default_rng(7), register, report, TOKEN, 180, huge_bytes=1_200_000)
    )
    channel.close()
    by_code = Counter()
    for (kind, code), k in codes.items():
        by_code[code] += k
        assert code in REFUSALS | {"INTERNAL"}, (kind, code)
        if code == "INTERNAL":  # only gRPC's own "could not deserialise", never a handler's failure
            assert kind in ("garbage", "swapped"), (kind, code)
    assert sum(by_code.values()) == 180
    assert running.service.stats["refused_internal"] == 0
    assert by_code["UNAUTHENTICATED"] >= 20 and by_code["INVALID_ARGUMENT"] >= 60
    assert by_code["RESOURCE_EXHAUSTED"] >= 20  # the huge messages
    # Nothing the fuzzer sent reached the log or the learner ...
    decisions = [r for r in read_log(running.log_path) if r["kind"] == "decision"]
    assert [r["job"] for r in decisions] == ["legit"]
    assert [r["job"] for r in spy.records] == ["legit"]
    assert running.service.sessions() == 1
    # ... and the legitimate job is still served, from where it was.
    _, _, _, _, info = env.step(env.unwrapped.batches.astype(np.float32))
    assert client.decide(info["report"], env.unwrapped.batches) is not None
    assert client.seq == 2 and client.counts["fallbacks"] == 0
