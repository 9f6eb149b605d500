"""Clients of the arbitrator: a job's connection, and the same as a controller.

:class:`ArbitratorClient` tells two failures apart:

* **a refusal** (``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``INVALID_ARGUMENT``,
  ``FAILED_PRECONDITION``, and ``NOT_FOUND`` at registration: a wrong token, an unknown bundle, a
  malformed request) is permanent: the call raises :class:`ArbitratorRefused`, naming the service's
  cause, unless the job opted into running without the policy (``allow_without_policy=True``), when
  it logs an ERROR and trains on at its current batches without asking again;
* **the end of the job** as the service sees it (``OUT_OF_RANGE``: its target or time budget was
  reached) while the job trains on: one WARNING, and the job decides alone from then on;
* **a loss of the service** (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``,
  ``INTERNAL``, ...) never blocks or crashes training: every call has a deadline (``timeout_s``), a
  failed call returns ``None`` (the job keeps its current batches), one WARNING is logged at the
  first failure of each outage, and no call is made until a back-off (exponential with jitter,
  capped) has passed; the next decision then re-registers if the service lost the job (restart,
  expiry: ``NOT_FOUND`` on a report).

Every decision made without the policy, for either reason, is counted
(:attr:`ArbitratorClient.decisions_without_policy`) and flagged
(:attr:`RemoteController.last_without_policy`), so an episode's timeline and summary
(:func:`dynamix_gym.evaluation.run_episode`) carry them. Decisions are numbered: a report whose
answer was lost is resent with the same ``seq`` and the service answers with the decision it
already made, so none is duplicated.

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
from dynamix_gym.service.messages import JOB_ID, report_to_proto, spec_to_proto
from dynamix_gym.service.transport import MAX_MESSAGE_BYTES, TOKEN_HEADER
from sim.protocol import BackendSpec, IntervalReport

log = logging.getLogger(__name__)

TOKEN_ENV = "DYNAMIX_ARBITRATOR_TOKEN"
#: Refusals: the service will not serve this request, so retrying it cannot help.
REFUSAL_CODES = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,  # at registration; on a report: the service lost the session
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
)
#: What the job can do about each refusal.
_REMEDY = {
    "UNAUTHENTICATED": f"the token is not the service's: check ${TOKEN_ENV} or token_file",
    "PERMISSION_DENIED": "the token may not use this service",
    "NOT_FOUND": "the service does not hold what the job asked for",
    "INVALID_ARGUMENT": "the service does not accept a field of the request (named in its cause)",
    "FAILED_PRECONDITION": "the service cannot serve this job as it is configured (its cause says why)",
}
#: Largest deadline and back-off a job may set (seconds): beyond, a stalled call stalls training.
MAX_TIMEOUT_S = 60.0
MAX_BACKOFF_S = 3600.0


class ArbitratorRefused(RuntimeError):
    """The arbitrator refused the job: a permanent cause (wrong token, unknown bundle, a malformed
    request), named by ``code`` and the service's ``details``."""

    def __init__(self, address: str, job_id: str, rpc: str, code: grpc.StatusCode, details: str) -> None:
        self.address, self.job_id, self.rpc, self.code, self.details = address, job_id, rpc, code, details
        super().__init__(
            f"the arbitrator at {address} refused job {job_id!r} ({rpc}: {code.name}: {details}); "
            f"{_REMEDY.get(code.name, 'see the service log')}. To train at the current batches without "
            "the policy anyway, set allow_without_policy=true (deploy: +arbitrator_kwargs.allow_without_policy=true)"
        )


def check_address(address: str) -> str:
    """``address`` if it reads ``host:port`` with a port in [1, 65535]; else a ValueError."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"arbitrator address must read host:port with a port in [1, 65535], got {address!r}")
    return str(address)


def client_token(token: str | None = None, token_file: str | Path | None = None) -> str:
    """``token``, else the contents of ``token_file``, else ``$DYNAMIX_ARBITRATOR_TOKEN``."""
    if token:
        return token
    if token_file:
        path = Path(token_file)
        if not path.is_file():
            raise ValueError(f"token_file {str(path)!r} does not exist")
        return path.read_text().strip()
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
        timeout_s: deadline of every call, in (0, 60] s.
        backoff_s: first wait after a failure (doubling, jittered), 0 < backoff_s <= max_backoff_s.
        max_backoff_s: largest wait after a failure, at most 3600 s.
        ca_file: a PEM root certificate: connect with TLS.
        allow_without_policy: when the service refuses the job, train on at the current batches
            (logged as an ERROR, every decision counted as made without the policy) instead of
            raising :class:`ArbitratorRefused`.
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
        allow_without_policy: bool = False,
        rng: np.random.Generator | None = None,
        clock=time.monotonic,
    ) -> None:
        check_address(address)
        if not isinstance(job_id, str) or not JOB_ID.match(job_id):
            raise ValueError(f"job_id must be 1-64 characters of [A-Za-z0-9._-], got {job_id!r}")
        for name, value, hi in (
            ("timeout_s", timeout_s, MAX_TIMEOUT_S),
            ("backoff_s", backoff_s, MAX_BACKOFF_S),
            ("max_backoff_s", max_backoff_s, MAX_BACKOFF_S),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= hi:
                raise ValueError(f"{name} must lie in (0, {hi:g}] seconds, got {value!r}")
        if backoff_s > max_backoff_s:
            raise ValueError(f"backoff_s must be <= max_backoff_s ({max_backoff_s}), got {backoff_s}")
        if not isinstance(allow_without_policy, bool):
            raise ValueError(f"allow_without_policy must be true or false, got {allow_without_policy!r}")
        self.address = address
        self.allow_without_policy = allow_without_policy
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
        #: counters: decisions, replayed, fallbacks (decisions made without the policy: the job kept
        #: its batches), errors by code (error_<code>), registers, outages
        self.counts: dict[str, int] = {
            "decisions": 0, "replayed": 0, "fallbacks": 0, "registers": 0, "outages": 0,
        }  # fmt: skip
        self.last_error: str | None = None
        #: the refusal the job opted to train through (``allow_without_policy``), else ``None``
        self.refused: ArbitratorRefused | None = None
        self._outage = False  # a failure was warned of and the service has not answered since
        #: why the service ended the job (its target or time budget) while it trains on, else ``None``
        self.ended: str | None = None

    @property
    def decisions_without_policy(self) -> int:
        """Decisions at which the job kept its batches because the service refused or did not answer."""
        return self.counts["fallbacks"]

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
        reply = self._call("Register", self._stub.Register, req)
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
        """The service's next local batches for ``report``, or ``None`` (keep ``current``).

        Raises:
            ArbitratorRefused: the service refused the job (unless ``allow_without_policy``).
        """
        if self.spec is None:
            raise RuntimeError("ArbitratorClient.decide() before register()")
        if self.refused is not None or self.ended is not None or self.clock() < self._retry_at:
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
        reply = self._call("Report", self._stub.Report, req)
        lost = reply is None and self.session is None and self.refused is None and self.ended is None
        if lost and self._register():  # the service lost the session: register again, resend
            req.session_id, req.seq = self.session, self.seq
            reply = self._call("Report", self._stub.Report, req)
        if reply is None:
            self.counts["fallbacks"] += 1
            return None
        self.seq = int(reply.seq) + 1
        self.policy_version = int(reply.policy_version)
        self.counts["replayed" if reply.replayed else "decisions"] += 1
        return np.asarray(reply.local_batch, dtype=np.int64)

    def _call(self, rpc: str, method, request) -> Any:
        """``method(request)`` within the deadline; ``None`` when it failed (a lost session, a loss
        of the service, or a refusal the job opted to run through)."""
        try:
            reply = method(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            details = str(e.details() if hasattr(e, "details") else e)
            self.last_error = f"{code.name}: {details}"
            self.counts[f"error_{code.name.lower()}"] = self.counts.get(f"error_{code.name.lower()}", 0) + 1
            if code == grpc.StatusCode.NOT_FOUND and rpc != "Register":
                self.session = None  # the service restarted or expired the job: register again
                return None
            if code in REFUSAL_CODES:
                self._refuse(ArbitratorRefused(self.address, self.job_id, rpc, code, details))
                return None
            if code == grpc.StatusCode.OUT_OF_RANGE:  # the service ended the job; it trains on alone
                self.ended = details
                log.warning(
                    "arbitrator at %s: %s for job %r; it trains on at its current batches, every further "
                    "decision counted as made without the policy",
                    self.address,
                    details,
                    self.job_id,
                )
                return None
            self._lose(code, details)
            return None
        if self._outage:
            log.info(
                "arbitrator at %s answers job %r again (%d decisions so far made without the policy)",
                self.address,
                self.job_id,
                self.decisions_without_policy,
            )
        self._outage = False
        self._failures = 0
        self._retry_at = -math.inf
        return reply

    def _refuse(self, refusal: ArbitratorRefused) -> None:
        """A permanent refusal: raise it, or (``allow_without_policy``) log it and stop asking."""
        if not self.allow_without_policy:
            log.error("%s", refusal)
            raise refusal
        self.refused = refusal
        self.session = None
        log.error(
            "arbitrator at %s refused job %r (%s: %s: %s); allow_without_policy=true: TRAINING GOES ON "
            "WITHOUT THE POLICY at the current batches, every further decision counted as made without it",
            self.address,
            self.job_id,
            refusal.rpc,
            refusal.code.name,
            refusal.details,
        )

    def _lose(self, code: grpc.StatusCode, details: str) -> None:
        """The service did not answer: warn once per outage and back off."""
        if not self._outage:
            self._outage = True
            self.counts["outages"] += 1
            log.warning(
                "arbitrator at %s did not answer job %r (%s: %s): the job keeps its current batches and "
                "asks again after a back-off; decisions until it answers are made without the policy",
                self.address,
                self.job_id,
                code.name,
                details,
            )
        self._failures += 1
        wait = min(self.backoff_s * 2 ** (self._failures - 1), self.max_backoff_s)
        self._retry_at = self.clock() + wait * (0.5 + 0.5 * self.rng.random())

    def close(self, final_report: IntervalReport | None = None) -> None:
        """Tell the service the job is over (best effort; ``final_report``: the interval that ended
        it, whose reward and time the service has not seen) and close the channel."""
        if self.session is not None:
            req = pb.CloseRequest(session_id=self.session)
            if final_report is not None:
                req.final_report.CopyFrom(report_to_proto(final_report))
            try:
                self._call("Close", self._stub.Close, req)
            except ArbitratorRefused as e:  # the job is over either way: never fail its shutdown
                log.warning(
                    "arbitrator at %s refused job %r's close: %s", self.address, self.job_id, e.details
                )
            self.session = None
        self._channel.close()


class RemoteController(BaseController):
    """The arbitrator as a controller: sends each report, applies the batches it returns.

    A refusal raises :class:`ArbitratorRefused` (at :meth:`reset` for a registration) unless
    ``allow_without_policy``; when the service is slow or down the job keeps its current batches
    (see :class:`ArbitratorClient`). ``last_without_policy`` flags the last decision made without
    the policy; :func:`dynamix_gym.evaluation.run_episode` records it. ``client_kwargs`` go to the
    client (token, job_id, timeout_s, allow_without_policy, ...).
    """

    name: ClassVar[str] = "arbitrator"
    action_mode: ClassVar[str] = "absolute"

    def __init__(self, address: str, interval: int = 50, **client_kwargs: Any) -> None:
        self.client = ArbitratorClient(address, **client_kwargs)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval (K) must be an integer >= 1, got {interval!r}")
        self.interval = int(interval)
        self.last_without_policy = False

    @property
    def decisions_without_policy(self) -> int:
        return self.client.decisions_without_policy

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.last_without_policy = False
        self.client.register(spec, self.interval)

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True):
        current = np.asarray(info["local_batches"], dtype=np.int64)
        new = self.client.decide(info["report"], current)
        self.last_without_policy = new is None
        return (current if new is None else new).astype(np.float32), None

    def close(self, final_report: IntervalReport | None = None) -> None:
        self.client.close(final_report)
