"""The arbitrator's gRPC transport: the token check, message bounds, the listening port, and the
log line of every refused call.

Every call carries ``authorization: Bearer <token>``, compared in constant time
(:func:`hmac.compare_digest`) before any handler runs. Every refusal, the token check's and the
handlers' alike, is logged once at WARNING with its cause, the caller's address (gRPC's peer
string) and the job it names (:func:`log_refusal`); the token a caller presented is never logged.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import arbitrator_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: Default bound on any message, either way (bytes). A 1024-worker report is about 150 KiB.
MAX_MESSAGE_BYTES = 1 << 20
TOKEN_HEADER = "authorization"
SERVICE_PATH = "/dynamix.arbitrator.v1.Arbitrator/"


def log_refusal(rpc: str, peer: str, job: str | None, code: grpc.StatusCode, cause: str) -> None:
    """One WARNING line for a refused call: the RPC, the caller, the job (``None``: not known) and
    the cause. ``job`` comes from the caller, so it is shown quoted and cut to 64 characters."""
    shown = "?" if job is None else repr(job[:64])
    log.warning("refused %s from %s (job %s): %s: %s", rpc, peer, shown, code.name, cause)


def _parse(message: type) -> Callable[[bytes], Any]:
    """A deserialiser that never raises: an unreadable request is refused all the same, only its
    job is then unknown."""

    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except Exception:
            return None

    return parse


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses (``UNAUTHENTICATED``) every call whose ``authorization`` is not ``Bearer <token>``.

    Args:
        token: the shared token.
        stats: the service's counters (``refused_unauthenticated`` counts the refusals).
        job_of: session id -> the job that holds it (``None`` if none): names the job of a refused
            report or close in the log.
    """

    def __init__(
        self, token: str, stats: Counter, job_of: Callable[[str], str | None] = lambda _: None
    ) -> None:
        self._expected = f"Bearer {token}".encode()
        self._stats = stats
        self._job_of = job_of
        self._deny = {
            rpc: grpc.unary_unary_rpc_method_handler(self._denier(rpc), request_deserializer=_parse(msg))
            for rpc, msg in (
                ("Register", pb.RegisterRequest),
                ("Report", pb.ReportRequest),
                ("Close", pb.CloseRequest),
            )
        }
        self._deny_other = grpc.unary_unary_rpc_method_handler(self._denier("?"))

    def _denier(self, rpc: str):
        def deny(request, context):
            job = None
            if rpc == "Register" and request is not None:
                job = request.job_id
            elif request is not None and getattr(request, "session_id", ""):
                job = self._job_of(request.session_id)
            log_refusal(rpc, context.peer(), job, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

        return deny

    def intercept_service(self, continuation, handler_call_details):
        got = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == TOKEN_HEADER:
                got = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        if not hmac.compare_digest(got, self._expected):
            self._stats["refused_unauthenticated"] += 1
            method = handler_call_details.method or ""
            rpc = method[len(SERVICE_PATH) :] if method.startswith(SERVICE_PATH) else ""
            return self._deny.get(rpc, self._deny_other)
        return continuation(handler_call_details)


def load_token(token_file: str | Path | None, token_env: str | None, environ: dict | None = None) -> str:
    """The shared token: from ``token_file`` if given, else the environment variable ``token_env``.

    Raises:
        ValueError: when neither holds a token of at least 16 characters.
    """
    environ = os.environ if environ is None else environ
    if token_file:
        path = Path(token_file)
        if not path.is_file():
            raise ValueError(f"token_file {str(path)!r} does not exist")
        token = path.read_text().strip()
        source = f"token_file {str(path)!r}"
    elif token_env:
        token = environ.get(token_env, "").strip()
        source = f"environment variable {token_env}"
    else:
        raise ValueError("the arbitrator needs a token: set token_file=<path> or token_env=<variable>")
    if len(token) < 16 or any(c.isspace() for c in token) or not token.isprintable():
        raise ValueError(f"{source} must hold a token of at least 16 printable characters, no spaces")
    return token


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")


def build_server(
    service: Any,
    token: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    threads: int = 16,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_concurrent_rpcs: int = 256,
    cert_file: str | None = None,
    key_file: str | None = None,
    allow_insecure_remote: bool = False,
) -> tuple[grpc.Server, int]:
    """A ready (not started) gRPC server for ``service`` (an
    :class:`~dynamix_gym.service.server.ArbitratorService`) and the port it bound.

    It binds ``host`` (127.0.0.1 unless told otherwise). A non-loopback address without TLS
    (``cert_file`` + ``key_file``) is refused unless ``allow_insecure_remote``: the token would
    cross the network in clear.
    """
    from concurrent import futures

    if not 1024 <= max_message_bytes <= 64 << 20:
        raise ValueError(f"max_message_bytes must lie in [1024, 64 MiB], got {max_message_bytes}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must lie in [0, 65535], got {port}")
    tls = bool(cert_file or key_file)
    if tls and not (cert_file and key_file):
        raise ValueError("TLS needs both cert_file and key_file")
    if not is_loopback(host) and not tls and not allow_insecure_remote:
        raise ValueError(
            f"host {host!r} is not a loopback address: configure TLS (cert_file, key_file) so the token "
            "does not travel in clear, or set allow_insecure_remote=true"
        )
    options = [
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        ("grpc.max_send_message_length", int(max_message_bytes)),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="arbitrator"),
        interceptors=[TokenInterceptor(token, service.stats, service.job_of)],
        options=options,
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    pb_grpc.add_ArbitratorServicer_to_server(service, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls:
        creds = grpc.ssl_server_credentials([(Path(key_file).read_bytes(), Path(cert_file).read_bytes())])
        bound = server.add_secure_port(address, creds)
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind {address}")
    return server, bound
