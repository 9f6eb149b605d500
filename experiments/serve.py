"""Run the arbitrator: PPO bundles serving many training jobs over gRPC (conf/serve.yaml).

    DYNAMIX_ARBITRATOR_TOKEN=... python -m experiments.serve bundle=results/headline/policy host=127.0.0.1 port=50051
    python -m experiments.serve bundle=<dir> token_file=<path> learn=true     # online fine-tuning

Writes ``<log_dir>/endpoint.json`` (host, port, pid) once it listens, appends every registration,
decision and job end to ``<log_dir>/transitions.jsonl``, and (``learn=true``) keeps promoted
versions under ``<log_dir>/versions``. Stops on SIGTERM / SIGINT (or after ``max_runtime_s``),
finishing the calls in flight.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dynamix_gym.controllers.bundle import load_bundle
from dynamix_gym.service.learner import OnlineLearner
from dynamix_gym.service.learner import attach_learner as attach_online_learner
from dynamix_gym.service.server import ArbitratorService, PolicyStore, ServiceConfig
from dynamix_gym.service.transport import build_server, load_token
from experiments.common import atomic_write_text, plain

log = logging.getLogger(__name__)


def attach_learner(cfg: DictConfig, store: Any, service: Any, versions: Path) -> OnlineLearner:
    """The online learner of ``cfg.learner`` / ``cfg.validation`` (:func:`dynamix_gym.service.learner.attach_learner`)."""
    return attach_online_learner(
        service, store, versions, plain(cfg.learner), plain(cfg.validation), int(cfg.seed)
    )


def serve(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the service until SIGTERM / SIGINT or ``max_runtime_s``; returns its counters."""
    if "token" in cfg:
        raise ValueError(
            "never give the token on the command line (it shows in `ps` and shell history): "
            "use token_file=<path> or the environment variable named by token_env"
        )
    token = load_token(cfg.get("token_file"), cfg.get("token_env"))
    out = Path(out_dir or cfg.get("log_dir") or HydraConfig.get().runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(cfg.torch_threads))
    paths = {"default": cfg.bundle, **(plain(cfg.get("bundles")) or {})}
    store = PolicyStore({name: load_bundle(p) for name, p in paths.items() if p}, default="default")
    rng = np.random.default_rng(int(cfg.seed))
    learn = bool(cfg.learn)
    service = ArbitratorService(
        store,
        out / "transitions.jsonl",
        ServiceConfig(
            max_jobs=int(cfg.max_jobs),
            idle_timeout_s=float(cfg.idle_timeout_s),
            explore=bool(cfg.explore) or learn,
            out_of_range_sd=float(cfg.out_of_range_sd),
        ),
        rng=rng,
    )
    stop = threading.Event()
    learner_thread = None
    if learn:
        learner = attach_learner(cfg, store, service, out / "versions")
        learner_thread = threading.Thread(target=learner.run, args=(stop,), name="learner", daemon=True)
    server, port = build_server(
        service,
        token,
        host=str(cfg.host),
        port=int(cfg.port),
        threads=int(cfg.threads),
        max_message_bytes=int(cfg.max_message_bytes),
        max_concurrent_rpcs=int(cfg.max_concurrent_rpcs),
        cert_file=cfg.get("cert_file"),
        key_file=cfg.get("key_file"),
        allow_insecure_remote=bool(cfg.allow_insecure_remote),
    )
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    server.start()
    if learner_thread is not None:
        learner_thread.start()
    endpoint = {"host": str(cfg.host), "port": port, "pid": os.getpid(), "tls": bool(cfg.get("cert_file"))}
    atomic_write_text(out / "endpoint.json", json.dumps(endpoint) + "\n")
    log.info("arbitrator serving %s on %s:%d (log %s)", store.names(), cfg.host, port, out)
    t0 = time.monotonic()
    limit = cfg.get("max_runtime_s")
    try:
        while not stop.is_set():
            if limit is not None and time.monotonic() - t0 >= float(limit):
                break
            stop.wait(0.2)
    finally:
        stop.set()
        server.stop(grace=2.0).wait(5.0)
        if learner_thread is not None:
            learner.close()  # an update running in a child is terminated, not waited for
            learner_thread.join(timeout=120.0)
        service.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stats = service.summary()
    log.info("arbitrator stopped: %s", stats)
    atomic_write_text(out / "stats.json", json.dumps(stats, indent=1) + "\n")
    return stats


@hydra.main(version_base=None, config_path="../conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    serve(cfg)


if __name__ == "__main__":
    main()
