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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.controllers.base import env_options
from dynamix_gym.controllers.bundle import PolicyBundle, PPOController, load_bundle
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.service.learner import LearnerConfig, OnlineLearner
from dynamix_gym.service.server import ArbitratorService, PolicyStore, ServiceConfig
from dynamix_gym.service.transport import build_server, load_token
from experiments.common import REPO_ROOT, atomic_write_text, plain

log = logging.getLogger(__name__)

#: Seeds the benchmark keeps for scoring; validation of online updates never uses them.
MIN_VALIDATION_SEED = 100


def episode_tta(summary: dict[str, Any]) -> float:
    """A run's time to accuracy, or twice the time used when it missed the target (as pretraining's
    validation scores a miss)."""
    return float(
        summary["time_to_accuracy_s"] if summary["reached_target"] else 2.0 * summary["total_time_s"]
    )


def score_bundle(bundle: PolicyBundle, tasks: dict, names: list[str], seeds: list[int]) -> dict[str, float]:
    """{task: mean :func:`episode_tta` over ``seeds``} of ``bundle`` on the simulated benchmark
    ``tasks`` named in ``names``, each env built with the bundle's schema and steps."""
    from experiments.benchmark import task_specs

    ctl = PPOController(bundle=bundle)
    out = {}
    for name in names:
        task = tasks[name]
        specs = task_specs(task, {"kind": "time"})
        times = []
        for seed in seeds:
            env = HeteroClusterEnv(
                **specs,
                interval=int(task.get("interval", 50)),
                action_mode=ctl.action_mode,
                **env_options(ctl),
            )
            try:
                times.append(episode_tta(run_episode(env, ctl, seed).summary))
            finally:
                env.close()
        out[name] = float(np.mean(times))
    return out


def make_validator(validation: dict[str, Any]):
    """bundle -> {task: mean TTA (s)} over held-out simulated tasks of the benchmark's train split
    (twice the time used when a run misses the target)."""
    from experiments.benchmark import split_tasks

    split = str(validation.get("split", "train"))
    if split == "test":
        raise ValueError("validation.split=test: the benchmark's test split is for scoring only")
    bench = OmegaConf.load(REPO_ROOT / str(validation.get("benchmark", "conf/benchmark/v1.yaml")))
    tasks, _ = split_tasks(bench, split)
    names = list(validation.get("tasks") or tasks)
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        raise ValueError(f"validation.tasks {unknown} are not in split {split!r}: {sorted(tasks)}")
    seeds = [int(s) for s in validation.get("seeds", [100, 101])]
    if min(seeds) < MIN_VALIDATION_SEED:
        raise ValueError(f"validation.seeds must be >= {MIN_VALIDATION_SEED}, got {seeds}")

    return Validator({n: tasks[n] for n in names}, names, seeds)


@dataclass(frozen=True)
class Validator:
    """bundle -> {task: mean :func:`episode_tta` over ``seeds``}: a plain object, so that
    ``learner.worker=process`` can send it to the child that validates a candidate."""

    tasks: dict[str, Any]
    names: list[str]
    seeds: list[int]

    def __call__(self, bundle: PolicyBundle) -> dict[str, float]:
        return score_bundle(bundle, self.tasks, self.names, self.seeds)


def attach_learner(cfg: DictConfig, store: Any, service: Any, versions: Path) -> OnlineLearner:
    """The online learner of ``cfg.learner`` / ``cfg.validation`` over the store's default bundle,
    its candidates kept under ``versions``, attached to ``service`` (the one place both apps build it)."""
    learner = OnlineLearner(
        store,
        "default",
        versions,
        make_validator(plain(cfg.validation)),
        LearnerConfig(**plain(cfg.learner)),
        rng=np.random.default_rng(int(cfg.seed) + 1),
        log=service.log,
    )
    service.learner = learner
    return learner


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
