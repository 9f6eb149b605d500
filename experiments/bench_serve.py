"""Load, fault and fuzz benchmark of the arbitrator service, on this machine only (127.0.0.1).

    python -m experiments.bench_serve                    # all three stages (conf/bench_serve.yaml)
    python -m experiments.bench_serve stage=load jobs=64 decisions=10000

* ``load``: ``jobs`` concurrent simulated jobs (threads in ``client_procs`` processes) against one
  service process until ``decisions`` decisions were made; each job sends a report every
  ``think_s`` seconds (far more often than a real job's K iterations) and starts a new episode
  when one ends. Reported: decision latency at the client (the gRPC round trip, p50/p99/max), the
  service's resident memory over the run (psutil), and, from the clients' records and the
  service's log, decisions dropped (a job's logged seqs not contiguous, or a decision a client
  received missing from the log) and duplicated (one (job, seq) decided twice).
* ``kill``: the service is killed (SIGKILL) mid-run and restarted on the same port and log;
  every client must finish its episodes, reconnect, and every decision a client received must be
  in the log (the log is written before the reply), which must parse but for a torn last line.
* ``fuzz``: a stream of malformed requests (dynamix_gym.service.fuzz); counts by status code, and
  the service must still be alive and serving afterwards.

Every loop is bounded in count and time and stops by itself; the service process is stopped (or
killed) by this script in every case.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import psutil
from omegaconf import DictConfig

from experiments.common import REPO_ROOT, atomic_write_text, plain

log = logging.getLogger(__name__)

TOKEN_ENV = "DYNAMIX_ARBITRATOR_TOKEN"


# --------------------------------------------------------------------------------------------
# The service process
# --------------------------------------------------------------------------------------------
class ServiceProcess:
    """``python -m experiments.serve`` on 127.0.0.1 with a fresh token, its port read back."""

    def __init__(self, bundle: str, log_dir: Path, token: str, port: int = 0, extra: list[str] | None = None):
        self.bundle, self.log_dir, self.token, self.extra = bundle, log_dir, token, extra or []
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        endpoint = self.log_dir / "endpoint.json"
        endpoint.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "experiments.serve",
            f"bundle={self.bundle}",
            "host=127.0.0.1",
            f"port={self.port}",
            f"log_dir={self.log_dir}",
            "max_runtime_s=900",
            f"hydra.run.dir={self.log_dir}/hydra",
            *self.extra,
        ]
        env = {**os.environ, TOKEN_ENV: self.token, "OMP_NUM_THREADS": "1"}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stderr = open(self.log_dir / "service.stderr", "a")
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=stderr, stderr=stderr)
        t0 = time.monotonic()
        while not endpoint.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the service exited ({self.proc.returncode}); see {self.log_dir}/service.stderr"
                )
            if time.monotonic() - t0 > timeout_s:
                self.kill()
                raise TimeoutError(f"the service did not listen within {timeout_s} s")
            time.sleep(0.1)
        self.port = int(json.loads(endpoint.read_text())["port"])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def rss_mib(self) -> float:
        try:
            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except (psutil.Error, AttributeError):
            return float("nan")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


# --------------------------------------------------------------------------------------------
# Clients (run in child processes)
# --------------------------------------------------------------------------------------------
def _job_thread(args: dict[str, Any], index: int, quota: int, out: list, stop_at: float) -> None:
    import torch

    from dynamix_gym.benchmark import task_specs
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.service.client import ArbitratorClient

    torch.set_num_threads(1)
    task = args["tasks"][index % len(args["tasks"])]
    specs = task_specs(task, {"kind": "time"})
    rng = np.random.default_rng(args["seed"] * 1000 + index)
    made, episode = 0, 0
    while made < quota and time.monotonic() < stop_at:
        job_id = f"p{args['proc']}-t{index}-e{episode}"
        env = HeteroClusterEnv(**specs, action_mode="absolute", interval=int(task.get("interval", 50)))
        client = ArbitratorClient(
            args["address"],
            token=args["token"],
            job_id=job_id,
            task=job_id.split("-e")[0],
            timeout_s=args["timeout_s"],
            backoff_s=0.1,
            max_backoff_s=1.0,
            rng=rng,
        )
        _, info = env.reset(seed=int(rng.integers(100, 10**6)))
        client.register(env.backend.spec, env.interval)
        done = False
        received: list[tuple[int, list[int]]] = []
        latencies: list[float] = []
        sent_at: list[float] = []  # wall clock of each call, to place it against the learner's updates
        fallbacks = 0
        while not done and made < quota and time.monotonic() < stop_at:
            t_wall, t0 = time.time(), time.perf_counter()
            new = client.decide(info["report"], env.unwrapped.batches)
            dt = time.perf_counter() - t0
            if new is None:
                fallbacks += 1
                action = env.unwrapped.batches
            else:
                latencies.append(dt)
                sent_at.append(t_wall)
                received.append((client.seq - 1, new.tolist()))
                made += 1
                action = new
            _, _, term, trunc, info = env.step(action.astype(np.float32))
            done = term or trunc
            time.sleep(args["think_s"])
        client.close(final_report=info["report"] if done else None)
        out.append(
            {
                "job": job_id,
                "received": received,
                "latency_s": latencies,
                "sent_at": sent_at,
                "fallbacks": fallbacks,
                "registers": client.counts["registers"],
                "done": done,
            }
        )
        episode += 1


def client_main(args: dict[str, Any], result_path: str) -> None:
    """One client process: ``threads`` jobs, each up to its quota of decisions."""
    logging.basicConfig(level=logging.WARNING)
    if args["nice"]:
        os.nice(int(args["nice"]))  # the simulated jobs yield to the service (it has its own host in use)
    out: list = []
    stop_at = time.monotonic() + args["max_s"]
    threads = [
        threading.Thread(target=_job_thread, args=(args, i, args["quota"], out, stop_at), daemon=True)
        for i in range(args["threads"])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args["max_s"] + 60)
    atomic_write_text(Path(result_path), json.dumps(out) + "\n")


def run_clients(
    cfg: DictConfig,
    address: str,
    token: str,
    jobs: int,
    decisions: int,
    out: Path,
    during=None,
    think_s: float | None = None,
) -> list[dict]:
    procs_n = int(cfg.client_procs)
    per_proc = [jobs // procs_n + (1 if i < jobs % procs_n else 0) for i in range(procs_n)]
    quota = int(np.ceil(decisions / jobs))
    ctx = mp.get_context("spawn")
    procs, paths = [], []
    for p, threads in enumerate(per_proc):
        args = {
            "address": address,
            "token": token,
            "tasks": plain(cfg.tasks),
            "threads": threads,
            "quota": quota,
            "think_s": float(cfg.think_s if think_s is None else think_s),
            "timeout_s": float(cfg.timeout_s),
            "seed": int(cfg.seed) + p,
            "proc": p,
            "max_s": float(cfg.max_client_s),
            "nice": int(cfg.client_nice),
        }
        path = out / f"clients-{p}.json"
        path.unlink(missing_ok=True)
        proc = ctx.Process(target=client_main, args=(args, str(path)), daemon=True)
        proc.start()
        procs.append(proc)
        paths.append(path)
    if during is not None:
        during(procs)
    for proc in procs:
        proc.join(float(cfg.max_client_s) + 120)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    results = []
    for path in paths:
        if path.exists():
            results += json.loads(path.read_text())
    return results


# --------------------------------------------------------------------------------------------
# Checking the log against what the clients received
# --------------------------------------------------------------------------------------------
def audit(log_path: Path, results: list[dict]) -> dict[str, Any]:
    from dynamix_gym.service.translog import read_log

    lines = log_path.read_text(errors="replace").splitlines()
    records = list(read_log(log_path))
    logged: dict[str, dict[int, list[int]]] = {}
    dup = 0
    for r in records:
        if r.get("kind") != "decision":
            continue
        seqs = logged.setdefault(r["job"], {})
        dup += r["seq"] in seqs
        seqs[r["seq"]] = r["action"]
    gaps = sum(1 for seqs in logged.values() if sorted(seqs) != list(range(min(seqs), min(seqs) + len(seqs))))
    received = {(j["job"], s) for j in results for s, _ in j["received"]}
    client_dup = sum(len(j["received"]) - len({s for s, _ in j["received"]}) for j in results)
    missing = sum(1 for job, s in received if s not in logged.get(job, {}))
    logged_not_received = sum(len(seqs) for seqs in logged.values()) - len(received)
    return {
        "log_lines": len(lines),
        "torn_lines": len(lines) - len(records),
        "logged_decisions": sum(len(s) for s in logged.values()),
        "received_decisions": len(received),
        "duplicated_in_log": dup,
        "duplicated_at_clients": client_dup,
        "jobs_with_seq_gaps": gaps,
        "received_but_not_logged": missing,
        "logged_but_not_received": logged_not_received,
    }


def _latency(results: list[dict], mask: np.ndarray | None = None) -> dict[str, float]:
    lat = np.array([x for j in results for x in j["latency_s"]]) * 1e3
    if mask is not None:
        lat = lat[mask]
    if lat.size == 0:
        return {}
    return {
        "n": int(lat.size),
        "p50_ms": float(np.percentile(lat, 50)),
        "p90_ms": float(np.percentile(lat, 90)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
    }


# --------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------
def _fresh(folder: Path) -> Path:
    """A stage's folder, emptied: the service's log is append-only, and the audit reads one run."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def stage_load(cfg: DictConfig, out: Path, token: str) -> dict[str, Any]:
    svc = ServiceProcess(
        str(cfg.bundle), _fresh(out / "load"), token, extra=list(cfg.get("service_args") or [])
    )
    svc.start()
    rss: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            rss.append((time.monotonic() - t0, svc.rss_mib()))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        results = run_clients(cfg, svc.address, token, int(cfg.jobs), int(cfg.decisions), out / "load")
    finally:
        wall = time.monotonic() - t0
        stop.set()
        sampler.join(5)
        svc.stop()
    checks = audit(out / "load" / "transitions.jsonl", results)
    stats_file = out / "load" / "stats.json"
    service_stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    r = np.array([m for _, m in rss if np.isfinite(m)])
    q = max(len(r) // 10, 1)
    updates = _updates(out / "load" / "versions" / "lineage.json")
    return {
        "jobs": int(cfg.jobs),
        "think_s": float(cfg.think_s),
        "episodes": len(results),
        "wall_s": wall,
        "decisions_per_s": checks["received_decisions"] / wall,
        "fallbacks": sum(j["fallbacks"] for j in results),
        "latency": _latency(results),
        "in_service_ms": service_stats.get("decide_ms"),
        "service_args": list(cfg.get("service_args") or []),
        "learner_updates": updates,
        "latency_by_update": _latency_by_update(results, updates),
        "load_average": os.getloadavg(),
        "service_rss_mib": {
            "first_10pct_mean": float(r[:q].mean()),
            "last_10pct_mean": float(r[-q:].mean()),
            "peak": float(r.max()),
            "samples": len(r),
        },
        **checks,
    }


def _updates(lineage: Path) -> list[dict[str, Any]]:
    """The online learner's candidates during a load run (``service_args=[learn=true]``)."""
    if not lineage.exists():
        return []
    versions = json.loads(lineage.read_text())["versions"]
    return [
        {k: e.get(k) for k in ("version", "status", "mode", "t_start", "t")}
        for e in versions
        if e.get("parent") is not None
    ]


def _latency_by_update(results: list[dict], updates: list[dict[str, Any]]) -> dict[str, Any]:
    """Decisions sent while an update (its DAgger, cloning and validation) ran, against the rest:
    the learner's cost to serving, measured within one run so the machine's load is the same."""
    windows = [(u["t_start"], u["t"]) for u in updates if u.get("t_start") is not None]
    if not windows:
        return {}
    sent = np.array([x for j in results for x in j["sent_at"]])
    during = np.zeros(sent.size, dtype=bool)
    for t0, t1 in windows:
        during |= (sent >= t0) & (sent <= t1)
    return {
        "update_s": [t1 - t0 for t0, t1 in windows],
        "during_updates": _latency(results, during),
        "outside_updates": _latency(results, ~during),
    }


def stage_kill(cfg: DictConfig, out: Path, token: str) -> dict[str, Any]:
    folder = _fresh(out / "kill")
    svc = ServiceProcess(str(cfg.bundle), folder, token)
    svc.start()
    events: dict[str, float] = {}

    def fault(procs) -> None:
        t0 = time.monotonic()
        log_file = folder / "transitions.jsonl"
        # kill once the jobs are well under way: after kill_after_decisions logged decisions
        while time.monotonic() - t0 < float(cfg.max_client_s) / 2:
            text = log_file.read_bytes() if log_file.exists() else b""
            if text.count(b'"kind":"decision"') >= int(cfg.kill_after_decisions):
                break
            time.sleep(0.2)
        events["decisions_before_kill"] = text.count(b'"kind":"decision"')
        svc.kill()  # SIGKILL: no shutdown, no flush beyond what each decision already did
        events["killed_at_s"] = time.monotonic() - t0
        time.sleep(float(cfg.down_s))
        svc.start()  # same port, same (append-only) log
        events["restarted_at_s"] = time.monotonic() - t0

    try:
        results = run_clients(
            cfg,
            svc.address,
            token,
            int(cfg.kill_jobs),
            int(cfg.kill_decisions),
            folder,
            during=fault,
            think_s=float(cfg.kill_think_s),
        )
    finally:
        svc.stop()
    checks = audit(folder / "transitions.jsonl", results)
    return {
        "jobs": int(cfg.kill_jobs),
        **events,
        "episodes": len(results),
        "episodes_finished_or_quota": sum(1 for j in results if j["done"] or j["received"]),
        "clients_that_fell_back": sum(1 for j in results if j["fallbacks"]),
        "clients_that_reregistered": sum(1 for j in results if j["registers"] >= 2),
        "fallbacks": sum(j["fallbacks"] for j in results),
        **checks,
    }


def stage_fuzz(cfg: DictConfig, out: Path, token: str) -> dict[str, Any]:
    import grpc

    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.service import arbitrator_pb2 as pb
    from dynamix_gym.service import fuzz
    from dynamix_gym.service.client import ArbitratorClient
    from dynamix_gym.service.messages import report_to_proto, spec_to_proto

    svc = ServiceProcess(str(cfg.bundle), _fresh(out / "fuzz"), token)
    svc.start()
    try:
        env = HeteroClusterEnv(workers=8, scenario="throttle", action_mode="absolute")
        _, info = env.reset(seed=100)
        client = ArbitratorClient(svc.address, token=token, job_id="legit", timeout_s=5.0)
        client.register(env.backend.spec, env.interval)
        assert client.decide(info["report"], env.unwrapped.batches) is not None
        register = pb.RegisterRequest(
            job_id="f", schema_version="1", spec=spec_to_proto(env.backend.spec), interval=50
        )
        report = pb.ReportRequest(
            session_id=client.session,
            seq=client.seq,
            report=report_to_proto(info["report"]),
            current_batch=env.unwrapped.batches.tolist(),
        )
        channel = grpc.insecure_channel(svc.address)
        t0 = time.monotonic()
        counts = fuzz.run(
            channel,
            fuzz.cases(np.random.default_rng(int(cfg.seed)), register, report, token, int(cfg.fuzz_cases)),
        )
        wall = time.monotonic() - t0
        channel.close()
        _, _, _, _, info = env.step(env.unwrapped.batches.astype(np.float32))
        still_served = client.decide(info["report"], env.unwrapped.batches) is not None
        alive = svc.alive()
        client.close()
    finally:
        svc.stop()
    by_code: Counter = Counter()
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, code), k in counts.items():
        by_code[code] += k
        by_kind.setdefault(kind, {})[code] = k
    return {
        "cases": int(cfg.fuzz_cases),
        "wall_s": wall,
        "by_code": dict(by_code),
        "by_kind": by_kind,
        "accepted": by_code.get("OK", 0),
        "service_alive_after": alive,
        "legit_job_still_served": still_served,
    }


def bench_serve(cfg: DictConfig) -> dict[str, Any]:
    out = Path(cfg.out_dir)
    if not out.is_absolute():
        out = REPO_ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    stages = ["load", "kill", "fuzz"] if cfg.stage == "all" else [str(cfg.stage)]
    result: dict[str, Any] = {"config": plain(cfg), "machine": {"cpus": os.cpu_count()}}
    for stage in stages:
        log.info("bench_serve: stage %s", stage)
        result[stage] = {"load": stage_load, "kill": stage_kill, "fuzz": stage_fuzz}[stage](cfg, out, token)
        log.info("%s: %s", stage, json.dumps(result[stage], default=str)[:2000])
    name = f"bench_serve_{cfg.stage}" + (f"_{cfg.label}" if cfg.get("label") else "")
    atomic_write_text(out / f"{name}.json", json.dumps(result, indent=1, default=str) + "\n")
    return result


@hydra.main(version_base=None, config_path="../conf", config_name="bench_serve")
def main(cfg: DictConfig) -> None:
    bench_serve(cfg)


if __name__ == "__main__":
    main()
