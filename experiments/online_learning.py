"""Online fine-tuning through the arbitrator, measured: the improvement curve and a poisoned stream.

    python -m experiments.online_learning                 # conf/online_learning.yaml

1. A service (real gRPC on 127.0.0.1) serves the pretrained bundle with exploration on and the
   online learner attached. Waves of simulated jobs drawn from the benchmark's *test* tasks (the
   stream the issue asks for; seeds from ``stream.seeds_from``, never the test split's scoring
   seeds) train through it; after each wave the learner runs one PPO update at a small learning
   rate, validates the candidate on the *train* split's tasks (seeds >= 100) and promotes it only
   if it is faster there.
2. The curve: every version the service ever served is scored deterministically on the stream's
   test tasks at the test split's own seeds (0, 1): mean time to accuracy (the time budget when
   the target is missed: dynamix_gym.benchmark's one score), and its ratio to the pretrained bundle.
3. Poisoning: anti-policy transitions (every action but the policy's choice paid for) are fed to
   the learner. Validation should reject the candidate; if it does, it is promoted anyway (an
   operator's override). Either way the jobs the poisoned version then serves measure it against
   its parent on the same tasks, and the service must roll back.

Writes ``<out_dir>/online.json`` and ``<out_dir>/online.md``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import DictConfig

from dynamix_gym.benchmark import load_suite, run_score_s, split_tasks, task_interval, task_specs
from dynamix_gym.benchmark.validation import score_bundle
from dynamix_gym.controllers.bundle import load_bundle
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.service.client import RemoteController
from dynamix_gym.service.learner import LearnerConfig, attach_learner
from dynamix_gym.service.server import ArbitratorService, PolicyStore, ServiceConfig
from dynamix_gym.service.transport import build_server
from experiments.common import REPO_ROOT, atomic_write_text, plain

log = logging.getLogger(__name__)


def _wave(address: str, token: str, tasks: dict, names: list[str], seeds: list[int], tag: str) -> list[dict]:
    """One job per (task, seed), concurrently, each through the service."""
    out: list[dict] = [None] * len(names)  # type: ignore[list-item]

    def job(i: int) -> None:
        task = tasks[names[i]]
        env = HeteroClusterEnv(
            **task_specs(task, {"kind": "time"}),
            action_mode="absolute",
            interval=task_interval(task),
        )
        ctl = RemoteController(address, token=token, job_id=f"{tag}-{i}", task=names[i], timeout_s=10.0)
        s = run_episode(env, ctl, seeds[i]).summary
        ctl.close(final_report=env.unwrapped.last_report)
        budget = env.unwrapped.backend.spec.time_budget_s
        out[i] = {
            "task": names[i],
            "seed": seeds[i],
            "tta_s": run_score_s(s["reached_target"], s["time_to_accuracy_s"], budget),
            "reached": s["reached_target"],
            "version": ctl.client.policy_version,
            "decisions": s["decisions"],
        }

    threads = [threading.Thread(target=job, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return out


def _poison(bundle, obs: np.ndarray, n: int, rng: np.random.Generator) -> list[tuple]:
    """Anti-policy transitions: every action but the serving policy's choice is paid for, its
    choice punished, with the policy's own values and log-probabilities (what the service would
    have logged)."""
    obs = obs[rng.integers(len(obs), size=n)]
    with torch.no_grad():
        t = torch.as_tensor(obs)
        dist = bundle.model.policy.get_distribution(t)
        probs = dist.distribution.probs
        width = probs.shape[1]  # the bundle's number of steps
        best = probs.argmax(dim=1).numpy()
        actions = (best + rng.integers(1, width, size=n)) % width
        logp = dist.log_prob(torch.as_tensor(actions)).numpy()
        logp_best = dist.log_prob(torch.as_tensor(best)).numpy()
        values = bundle.model.policy.predict_values(t).numpy().ravel()
    return [
        (f"poison{k % 16}", 0, obs[k], int(a), float(v), float(lp), 10.0, True, 0.0, -1)
        for k, (a, lp, v) in enumerate(zip(actions, logp, values, strict=True))
    ] + [
        (f"poison{k % 16}", 0, obs[k], int(b), float(v), float(lp), -10.0, True, 0.0, -1)
        for k, (b, lp, v) in enumerate(zip(best, logp_best, values, strict=True))
    ]


def online_learning(cfg: DictConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    out = Path(cfg.out_dir)
    out = out if out.is_absolute() else REPO_ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("transitions.jsonl",):
        (out / stale).unlink(missing_ok=True)
    bench = load_suite(cfg.benchmark)
    test_tasks, test_seeds = split_tasks(bench, "test")
    names = list(cfg.stream.tasks)
    seeds_from = int(cfg.stream.seeds_from)
    if seeds_from <= max(test_seeds):
        raise ValueError(f"stream.seeds_from must exceed the test split's scoring seeds {test_seeds}")
    token = "online-learning-" + "0" * 16
    bundle = load_bundle(REPO_ROOT / str(cfg.bundle))
    store = PolicyStore({"default": bundle})
    service = ArbitratorService(
        store,
        out / "transitions.jsonl",
        ServiceConfig(explore=True),
        rng=np.random.default_rng(int(cfg.seed)),
    )
    import shutil

    shutil.rmtree(out / "versions", ignore_errors=True)
    learner = attach_learner(
        service, store, out / "versions", plain(cfg.learner), plain(cfg.validation), int(cfg.seed)
    )
    server, port = build_server(service, token, port=0, threads=8)
    server.start()
    address = f"127.0.0.1:{port}"
    waves, t0 = [], time.monotonic()
    try:
        for w in range(int(cfg.stream.waves)):
            seeds = [seeds_from + w * len(names) + i for i in range(len(names))]
            jobs = _wave(address, token, test_tasks, names, seeds, f"w{w}")
            every = int(cfg.stream.get("update_every_waves", 1))
            due = (w + 1) % every == 0 and w < int(cfg.stream.waves) - 1
            entry = learner.step(force=True) if due else None
            waves.append(
                {
                    "wave": w,
                    "jobs": jobs,
                    "mean_tta_s": float(np.mean([j["tta_s"] for j in jobs])),
                    "update": None
                    if entry is None
                    else {
                        k: entry.get(k)
                        for k in (
                            "version",
                            "parent",
                            "status",
                            "validation_tta_s",
                            "parent_validation_tta_s",
                            "validation_ratio_to_parent",
                            "transitions",
                        )
                    },
                }
            )
            log.info("wave %d: mean TTA %.1f s; update %s", w, waves[-1]["mean_tta_s"], waves[-1]["update"])
        # --- poisoning ---------------------------------------------------------------------------------
        serving = store.get()
        obs = np.array([t.obs for t in learner.transitions()], dtype=np.float32)
        rng = np.random.default_rng(int(cfg.seed) + 2)
        # the poison is logged transitions: PPO's update takes them whatever mode served the stream
        poison_cfg = LearnerConfig(**{**plain(cfg.learner), "mode": "ppo", **plain(cfg.poison.learner)})
        learner.config = poison_cfg
        learner._buffer.clear()
        learner.add_transitions(_poison(serving.bundle, obs, int(cfg.poison.transitions), rng))
        gated = learner.step(force=True)
        forced = None
        if gated["status"] != "promoted":  # validation caught it: promote it anyway, as an operator might
            learner._buffer.clear()
            learner.add_transitions(_poison(serving.bundle, obs, int(cfg.poison.transitions), rng))
            forced = learner.step(force=True, skip_validation=True)
        poisoned = gated if forced is None else forced
        poisoned_waves = []
        for w in range(int(cfg.poison.waves)):
            if store.get().version != poisoned["version"]:
                break  # rolled back
            seeds = [seeds_from + 1000 + w * len(names) + i for i in range(len(names))]
            poisoned_waves.append(_wave(address, token, test_tasks, names, seeds, f"p{w}"))
        rolled_back = store.get().version == serving.version
    finally:
        server.stop(grace=None).wait(5.0)
        service.close()
    # --- the curve: every version scored on the test tasks at the test seeds -------------------------------
    curve = []
    base = None
    for e in learner.lineage:
        if e["status"] not in ("promoted", "rolled_back"):
            continue
        scores = score_bundle(load_bundle(e["path"]), test_tasks, names, [int(s) for s in test_seeds])
        mean = float(np.mean(list(scores.values())))
        base = mean if base is None else base
        curve.append(
            {
                "version": e["version"],
                "parent": e.get("parent"),
                "status": e["status"],
                "validation_tta_s": e.get("validation_tta_s"),
                "test_mean_tta_s": mean,
                "ratio_to_pretrained": mean / base,
                "test_by_task": scores,
                # what the service measured of it on the stream's jobs (ratio to its parent, test)
                "measured_tta_ratio": e.get("measured_tta_ratio"),
                "measured": e.get("measured"),
            }
        )
    result = {
        "stream_tasks": names,
        "score_seeds": test_seeds,
        "learner": plain(cfg.learner),
        "waves": waves,
        "curve": curve,
        "poison": {
            "validation_gate": {
                k: gated.get(k) for k in ("version", "status", "validation_tta_s", "parent_validation_tta_s")
            },
            "forced": None if forced is None else {k: forced.get(k) for k in ("version", "status")},
            "poisoned_version": poisoned["version"],
            "measured_tta_ratio": learner._entry(poisoned["version"]).get("measured_tta_ratio"),
            "rolled_back": rolled_back,
            "jobs_after_forced_promotion": poisoned_waves,
        },
        "wall_s": time.monotonic() - t0,
    }
    atomic_write_text(out / "online.json", json.dumps(result, indent=1, default=str) + "\n")
    atomic_write_text(out / "online.md", to_markdown(result))
    return result


def to_markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Online fine-tuning through the arbitrator (experiments/online_learning.py)",
        "",
        f"Stream: test tasks {', '.join(r['stream_tasks'])}; learner mode {r['learner'].get('mode', 'ppo')}, "
        + (
            f"{r['learner']['replica_episodes']} DAgger episodes per update, {r['learner']['replica_epochs']} "
            f"epochs at {r['learner']['replica_learning_rate']:g}"
            if r["learner"].get("mode") == "replica"
            else f"learning rate {r['learner']['learning_rate']:g}"
        )
        + f"; rollback test {r['learner'].get('rollback_test', 'window')}.",
        "",
        "## Waves served",
        "",
        "| wave | versions serving | stream mean TTA (s) | update | candidate val. TTA (s) | parent val. TTA (s) |",
        "|---|---|---|---|---|---|",
    ]
    for w in r["waves"]:
        u = w["update"] or {}
        vers = sorted({j["version"] for j in w["jobs"]})
        f = lambda x: "" if x is None else f"{x:.1f}"  # noqa: E731
        lines.append(
            f"| {w['wave']} | {vers} | {w['mean_tta_s']:.1f} | v{u.get('version', '')} "
            f"{u.get('status', '')} | {f(u.get('validation_tta_s'))} | {f(u.get('parent_validation_tta_s'))} |"
        )
    lines += [
        "",
        f"## Curve: each version on the stream's test tasks, test seeds {r['score_seeds']}",
        "",
        "Ratio: of the mean TTA (seconds: BERT's runs weigh most); gm: the geometric mean over the",
        "stream's tasks of the version's TTA over the pretrained bundle's (every task alike).",
        "",
        "Measured: the service's own measurement on the stream's jobs it served, its TTA ratio to its",
        "parent (the rollback test's estimate; p: the one-sided p-value, where computed).",
        "",
        "| version | parent | status | test mean TTA (s) | ratio to pretrained | gm | measured (jobs, p) | by task |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = r["curve"][0]["test_by_task"] if r["curve"] else {}
    for c in r["curve"]:
        by = {t: c["test_by_task"][t] / base[t] for t in base}
        gm = float(np.exp(np.mean(np.log(list(by.values())))))
        m, mr = c.get("measured") or {}, c.get("measured_tta_ratio")
        pv = "" if m.get("p_value") is None else f", p {m['p_value']:.3f}"
        measured = "" if mr is None else f"{mr:.3f} ({m.get('jobs', '?')} jobs{pv})"
        lines.append(
            f"| v{c['version']} | {c['parent']} | {c['status']} | {c['test_mean_tta_s']:.1f} | "
            f"{c['ratio_to_pretrained']:.3f} | {gm:.3f} | {measured} | "
            f"{', '.join(f'{t} {x:.3f}' for t, x in by.items())} |"
        )
    p = r["poison"]
    g = p["validation_gate"]
    lines += [
        "",
        "## Poisoned stream",
        "",
        f"- with validation: candidate v{g['version']} {g['status']} (validation TTA "
        f"{g['validation_tta_s']:.1f} s vs parent {g['parent_validation_tta_s']:.1f} s)",
        f"- {'promoted by validation' if p['forced'] is None else 'then promoted without validation'}: "
        f"v{p['poisoned_version']}; measured TTA ratio to its parent on the jobs it served: "
        f"{'-' if p['measured_tta_ratio'] is None else format(p['measured_tta_ratio'], '.3f')}; "
        f"rolled back: {p['rolled_back']}",
        "",
    ]
    return "\n".join(lines)


@hydra.main(version_base=None, config_path="../conf", config_name="online_learning")
def main(cfg: DictConfig) -> None:
    online_learning(cfg)


if __name__ == "__main__":
    main()
