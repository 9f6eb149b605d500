"""A stream of malformed and hostile requests, for the service's fuzz test and benchmark.

Each case is sent as raw bytes on the service's real methods (so wire-level garbage reaches the
server as it would from a hostile client). What a case may get back is only a refusal: gRPC's own
(undeserialisable bytes, oversized messages) or the service's (``INVALID_ARGUMENT`` naming the
field, ``UNAUTHENTICATED``, ``NOT_FOUND``, ``FAILED_PRECONDITION``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service.messages import SCALAR_RANGES, WORKER_RANGES
from dynamix_gym.service.transport import TOKEN_HEADER

METHODS = ("Register", "Report", "Close")
PREFIX = "/dynamix.arbitrator.v1.Arbitrator/"
BAD_FLOATS = (math.nan, math.inf, -math.inf, -1.0, 1e30, -1e-300)


@dataclass(frozen=True)
class Case:
    kind: str
    method: str
    payload: bytes
    token: str | None


def cases(
    rng: np.random.Generator,
    register: pb.RegisterRequest,
    report: pb.ReportRequest,
    token: str,
    count: int,
    huge_bytes: int = 2 << 20,
) -> Iterator[Case]:
    """``count`` fuzz cases built from a valid registration and report of a live session."""
    kinds = ("garbage", "swapped", "bad_float", "wrong_size", "bad_int", "huge", "token", "session", "spec")
    floats = list(WORKER_RANGES)
    scalars = list(SCALAR_RANGES)
    for i in range(count):
        kind = kinds[i % len(kinds)]
        tok: str | None = token
        if kind == "garbage":  # random bytes: wrong wire types, truncated varints, bad lengths
            method = METHODS[int(rng.integers(len(METHODS)))]
            payload = rng.bytes(int(rng.integers(1, 400)))
        elif kind == "swapped":  # a well-formed message of another type
            method = "Report"
            payload = register.SerializeToString() if rng.random() < 0.5 else b"\x12" + rng.bytes(30)
        elif kind == "bad_float":
            msg = pb.ReportRequest()
            msg.CopyFrom(report)
            if rng.random() < 0.7:
                field = getattr(msg.report, floats[int(rng.integers(len(floats)))])
                field[int(rng.integers(len(field)))] = BAD_FLOATS[int(rng.integers(len(BAD_FLOATS)))]
            else:
                name = scalars[int(rng.integers(len(scalars)))]
                value = BAD_FLOATS[int(rng.integers(len(BAD_FLOATS)))]
                if isinstance(getattr(msg.report, name), int):
                    value = -1 if not math.isfinite(value) or value > 0 else -(2**40)
                setattr(msg.report, name, value)
            method, payload = "Report", msg.SerializeToString()
        elif kind == "wrong_size":
            msg = pb.ReportRequest()
            msg.CopyFrom(report)
            field = getattr(msg.report, floats[int(rng.integers(len(floats)))])
            if rng.random() < 0.5:
                del field[-1]
            else:
                field.extend([0.5] * int(rng.integers(1, 2000)))
            method, payload = "Report", msg.SerializeToString()
        elif kind == "bad_int":
            msg = pb.ReportRequest()
            msg.CopyFrom(report)
            which = int(rng.integers(3))
            if which == 0:
                msg.report.local_batch[0] = int(rng.choice([0, -5, 2**40]))
            elif which == 1:
                del msg.current_batch[:]
            else:
                msg.report.iterations = 0
            method, payload = "Report", msg.SerializeToString()
        elif kind == "huge":
            msg = pb.ReportRequest()
            msg.CopyFrom(report)
            msg.report.cpu_util.extend([0.1] * (huge_bytes // 8))
            method, payload = "Report", msg.SerializeToString()
        elif kind == "token":
            method, payload = "Report", report.SerializeToString()
            tok = [None, "", "Bearer", token[:-1], token + "x", "x" * 4096][i // len(kinds) % 6]
        elif kind == "session":
            msg = pb.ReportRequest()
            msg.CopyFrom(report)
            if rng.random() < 0.5:
                msg.session_id = rng.bytes(8).hex()
            else:
                msg.seq = int(rng.integers(10**6, 10**9))
            method, payload = "Report", msg.SerializeToString()
        else:  # a malformed registration
            msg = pb.RegisterRequest()
            msg.CopyFrom(register)
            which = int(rng.integers(5))
            if which == 0:
                msg.spec.min_batch[0] = -1
            elif which == 1:
                msg.spec.target_accuracy = math.nan
            elif which == 2:
                msg.spec.gpu_types.extend(["T4"] * 5000)
            elif which == 3:
                msg.job_id = "../../etc/passwd"
            else:
                msg.interval = -3
            method, payload = "Register", msg.SerializeToString()
        yield Case(kind, method, payload, tok)


def send(channel: grpc.Channel, case: Case, timeout_s: float = 2.0) -> str:
    """Send one case; the status code's name (``OK`` if it was accepted)."""
    call = channel.unary_unary(PREFIX + case.method, request_serializer=None, response_deserializer=None)
    md = None if case.token is None else ((TOKEN_HEADER, f"Bearer {case.token}"),)
    try:
        call(case.payload, timeout=timeout_s, metadata=md)
    except grpc.RpcError as e:
        return e.code().name
    return "OK"


def run(channel: grpc.Channel, stream: Iterator[Case]) -> Counter:
    """(kind, code) -> count over the stream."""
    out: Counter = Counter()
    for case in stream:
        out[(case.kind, send(channel, case))] += 1
    return out
