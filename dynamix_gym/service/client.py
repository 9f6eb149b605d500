"""Clients of the arbitrator: a job's connection, and the same as a controller.

:class:`ArbitratorClient` never blocks or crashes training: every call has a deadline
(``timeout_s``), a failed call returns ``None`` (the job keeps its current batches), and after a
failure no call is made until a back-off (exponential with jitter, capped) has passed; the next
decision then re-registers if the service lost the job (restart, expiry). Decisions are numbered:
a report whose answer was lost is resent with the same ``seq`` and the service answers with the
decision it already made, so none is duplicated.

:class:`RemoteController` wraps a client as a controller (``absolute`` actions), so
:func:`dynamix_gym.evaluation.run_episode`, ``experiments.deploy`` (the real DDP backend) and
``adapters.torchrun.DynamixController(arbitrator=...)`` use the service like any policy.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import grpc
import numpy as np

from dynamix_gym.controllers.base import BaseController
from dynamix_gym.obs import check_schema_version
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import arbitrator_pb2_grpc as pb_grpc
from dynamix_gym.service.messages import report_to_proto, spec_to_proto
from dynamix_gym.service.server import MAX_MESSAGE_BYTES, TOKEN_HEADER
from sim.protocol import BackendSpec, IntervalReport

log = logging.getLogger(__name__)

TOKEN_ENV = "DYNAMIX_ARBITRATOR_TOKEN"
#: Refusals that mean the request itself is wrong: retrying it cannot help.
FATAL_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


def client_token(token: str | None = None, token_file: str | Path | None = None) -> str:
    """``token``, else the contents of ``token_file``, else ``$DYNAMIX_ARBITRATOR_TOKEN``."""
    if token:
        return token
    if token_file:
        return Path(token_file).read_text().strip()
    value = os.environ.get(TOKEN_ENV, "").strip()
    if not value:
        raise ValueError(f"no arbitrator token: pass token= or token_file=, or set {TOKEN_ENV}")
    return value


class ArbitratorClient:
    """One job's connection to the arbitrator.

    Args:
        address: ``host:port`` of the service.
        token: the shared token (else ``token_file``, else ``$DYNAMIX_ARBITRATOR_TOKEN``).
        job_id: the job's name ([A-Za-z0-9._-], at most 64 characters).
        obs_schema: the observation schema the job's policy must read (1, 2, 3): the service refuses
            the registration (``FAILED_PRECONDITION``) if the named bundle reads another. ``None``:
            whichever the bundle reads. The service encodes the job's reports itself; after
            registering, :attr:`schema_version` is the schema it encodes them in.
        timeout_s: deadline of every call.
        backoff_s: first wait after a failure (doubling, jittered).
        max_backoff_s: largest wait after a failure.
        ca_file: a PEM root certificate: connect with TLS.
        rng: the generator of the back-off jitter.
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        job_id: str = "job",
        task: str = "",
        bundle: str = "",
        obs_schema: int | str | None = None,
        timeout_s: float = 0.5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        ca_file: str | Path | None = None,
        rng: np.random.Generator | None = None,
        clock=time.monotonic,
    ) -> None:
        if not timeout_s > 0 or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s}")
        if not 0 < backoff_s <= max_backoff_s:
            raise ValueError(f"need 0 < backoff_s <= max_backoff_s, got {backoff_s}, {max_backoff_s}")
        self.address = address
        self.job_id, self.task, self.bundle = job_id, task, bundle
        self.obs_schema = "" if obs_schema is None else check_schema_version("obs_schema", obs_schema)
        #: the observation schema the serving bundle reads (from the last registration's reply)
        self.schema_version: str | None = None
        self.timeout_s = float(timeout_s)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.clock = clock
        self._metadata = ((TOKEN_HEADER, f"Bearer {client_token(token, token_file)}"),)
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Reconnect quickly after a service restart (gRPC's default waits up to 2 minutes).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        if ca_file:
            creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.ArbitratorStub(self._channel)
        self.spec: BackendSpec | None = None
        self.session: str | None = None
        self.seq = 0
        self.policy_version: int | None = None
        self.action_mode: str | None = None
        self.action_steps: list[float] = []
        self._retry_at = -math.inf
        self._failures = 0
        #: counters: decisions, replayed, fallbacks (no decision: kept batches), errors by code, registers
        self.counts: dict[str, int] = {"decisions": 0, "replayed": 0, "fallbacks": 0, "registers": 0}
        self.last_error: str | None = None

    # --- registration -------------------------------------------------------------------------------
    def register(self, spec: BackendSpec, interval: int, *, workload: str | None = None) -> bool:
        """Remember the job's spec and try to register now; False (retried later) on failure."""
        self.spec, self.interval = spec, int(interval)
        self.workload = workload or spec.workload
        return self._register()

    def _register(self) -> bool:
        assert self.spec is not None
        req = pb.RegisterRequest(
            job_id=self.job_id,
            schema_version=self.obs_schema,
            spec=spec_to_proto(self.spec),
            workload=self.workload,
            interval=self.interval,
            bundle=self.bundle,
            next_seq=self.seq,
            task=self.task,
        )
        reply = self._call(self._stub.Register, req)
        if reply is None:
            return False
        self.session, self.seq = reply.session_id, int(reply.next_seq)
        self.policy_version = int(reply.policy_version)
        self.schema_version = reply.schema_version or None
        # what the serving bundle's actions are (the service applies them; the job gets batches)
        self.action_mode = reply.action_mode or "delta"
        self.action_steps = (
            list(reply.action_factors) if self.action_mode == "scale" else list(reply.action_set)
        )
        self.counts["registers"] += 1
        return True

    # --- decisions -------------------------------------------------------------------------------------
    def decide(self, report: IntervalReport, current: np.ndarray) -> np.ndarray | None:
        """The service's next local batches for ``report``, or ``None`` (keep ``current``)."""
        if self.spec is None:
            raise RuntimeError("ArbitratorClient.decide() before register()")
        if self.clock() < self._retry_at:
            self.counts["fallbacks"] += 1
            return None
        if self.session is None and not self._register():
            self.counts["fallbacks"] += 1
            return None
        req = pb.ReportRequest(
            session_id=self.session,
            seq=self.seq,
            report=report_to_proto(report),
            current_batch=np.asarray(current, dtype=np.int64).tolist(),
        )
        reply = self._call(self._stub.Report, req)
        if reply is None and self.session is None and self._register():  # lost by the service
            req.session_id, req.seq = self.session, self.seq
            reply = self._call(self._stub.Report, req)
        if reply is None:
            self.counts["fallbacks"] += 1
            return None
        self.seq = int(reply.seq) + 1
        self.policy_version = int(reply.policy_version)
        self.counts["replayed" if reply.replayed else "decisions"] += 1
        return np.asarray(reply.local_batch, dtype=np.int64)

    def _call(self, method, request) -> Any:
        try:
            reply = method(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            self.last_error = f"{code.name}: {e.details() if hasattr(e, 'details') else e}"
            self.counts[f"error_{code.name.lower()}"] = self.counts.get(f"error_{code.name.lower()}", 0) + 1
            if code == grpc.StatusCode.NOT_FOUND:
                self.session = None  # the service restarted or expired the job: register again
                return None
            if code in FATAL_CODES:
                log.warning(
                    "arbitrator refused the request (%s); keeping the current batches", self.last_error
                )
            self._failures += 1
            wait = min(self.backoff_s * 2 ** (self._failures - 1), self.max_backoff_s)
            self._retry_at = self.clock() + wait * (0.5 + 0.5 * self.rng.random())
            return None
        self._failures = 0
        self._retry_at = -math.inf
        return reply

    def close(self, final_report: IntervalReport | None = None) -> None:
        """Tell the service the job is over (best effort; ``final_report``: the interval that ended
        it, whose reward and time the service has not seen) and close the channel."""
        if self.session is not None:
            req = pb.CloseRequest(session_id=self.session)
            if final_report is not None:
                req.final_report.CopyFrom(report_to_proto(final_report))
            self._call(self._stub.Close, req)
            self.session = None
        self._channel.close()


class RemoteController(BaseController):
    """The arbitrator as a controller: sends each report, applies the batches it returns.

    When the service is slow or down the job keeps its current batches (see
    :class:`ArbitratorClient`). ``client_kwargs`` go to the client (token, job_id, timeout_s, ...).
    """

    name: ClassVar[str] = "arbitrator"
    action_mode: ClassVar[str] = "absolute"

    def __init__(self, address: str, interval: int = 50, **client_kwargs: Any) -> None:
        self.client = ArbitratorClient(address, **client_kwargs)
        self.interval = int(interval)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.client.register(spec, self.interval)

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True):
        current = np.asarray(info["local_batches"], dtype=np.int64)
        new = self.client.decide(info["report"], current)
        return (current if new is None else new).astype(np.float32), None

    def close(self, final_report: IntervalReport | None = None) -> None:
        self.client.close(final_report)
