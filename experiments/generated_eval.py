"""Score controllers on generated worlds: held-out draws of a training domain, beside a reference.

    python -m experiments.generated_eval
    python -m experiments.generated_eval 'domain_overrides={compound_probability: 1.0}' label=compound
    python -m experiments.generated_eval 'bundles={kept: results/policies/universal, new: runs/x/best}'
    python -m experiments.generated_eval 'bundles={cost: {path: results/policies/universal, split: balanced_cost}}'

The benchmark's train split is where bundles are tuned and picked; this app is the other place the
rules allow: worlds drawn from a :class:`~dynamix_gym.envs.randomized.DomainRandomization` (by
default the one the ``domain_from`` bundle was trained on, with ``domain_overrides`` on top, e.g.
compound faults that no benchmark train task has) at seeds the training never drew. Every
controller drives the same world per seed and cluster size (``DomainRandomization.sample`` of a
generator seeded with the seed, which seeds the episode too); the reference (``reference``: the time-to-target oracle unless told otherwise) is
driven too, and each run's ratio is its time to accuracy (twice the episode's time when the target
is missed) over the reference's.

Writes ``runs.csv`` (one row per controller, world and seed) and ``summary.md`` (geometric mean of
the ratios per controller, overall and per workload, and the share of runs reaching the target)
under ``out_dir``, atomically.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

import dynamix_gym  # noqa: F401  (registers the envs)
from dynamix_gym.backends.sim_backend import SimBackend
from dynamix_gym.controllers.base import env_options
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.randomized import DomainRandomization
from dynamix_gym.evaluation import run_episode
from experiments.common import atomic_write_text, plain

log = logging.getLogger(__name__)

#: The bundles scored when ``bundles`` is null.
DEFAULT_BUNDLES = {"universal": "results/policies/universal"}


def bundle_domain(path: str | Path) -> dict[str, Any]:
    """The training domain recorded in the bundle at ``path`` (its ``bundle.json`` config)."""
    meta = Path(to_absolute_path(str(path))) / "bundle.json"
    if not meta.is_file():
        raise ValueError(f"domain_from: {meta} does not exist (a bundle directory with bundle.json)")
    domain = json.loads(meta.read_text()).get("config", {}).get("domain")
    if not isinstance(domain, dict):
        raise ValueError(f"domain_from: {meta} records no training domain (config.domain)")
    return domain


def build_domain(cfg: DictConfig, workers: int) -> DomainRandomization:
    base = bundle_domain(cfg.domain_from) if cfg.domain_from else {}
    fields = {**base, **plain(cfg.domain_overrides or {}), "workers": int(workers)}
    known = set(DomainRandomization.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(
            f"domain_overrides: unknown DomainRandomization fields {unknown}; known: {sorted(known)}"
        )
    return DomainRandomization(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def _controllers(cfg: DictConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ref = plain(cfg.reference)
    out[str(ref.pop("label", ref.get("name")))] = ref
    bundles = plain(cfg.bundles) if cfg.bundles is not None else DEFAULT_BUNDLES
    for label, spec in bundles.items():
        if str(label) in out:
            raise ValueError(f"bundles.{label}: the reference's label; name the bundle otherwise")
        if isinstance(spec, dict):  # {path: <dir>, <PPOController argument>: ...}, e.g. split
            spec = dict(spec)
            if "path" not in spec:
                raise ValueError(f"bundles.{label}: a mapping needs a path (the bundle directory)")
            out[str(label)] = {"name": str(spec.pop("path")), **spec}
        else:
            out[str(label)] = {"name": str(spec)}
    return out


def score_runs(df: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Each run's ratio: its time to accuracy (twice its episode time when it missed) over the
    reference's on the same world and seed."""
    df = df.copy()
    df["score_s"] = np.where(df["reached_target"], df["time_to_accuracy_s"], 2.0 * df["total_time_s"])
    ref = df[df["label"] == reference].set_index(["workers", "seed"])["score_s"]
    df["ratio"] = (
        df["score_s"].to_numpy() / ref.loc[list(zip(df["workers"], df["seed"], strict=True))].to_numpy()
    )
    return df


def summary_table(df: pd.DataFrame) -> str:
    def gm(x):
        return float(np.exp(np.log(x).mean()))

    rows = [
        "| controller | x reference (geomean) | reached | "
        + " | ".join(sorted(df["workload"].unique()))
        + " |"
    ]
    rows.append("|---" * (3 + df["workload"].nunique()) + "|")
    for label, g in df.groupby("label", sort=False):
        per = [f"{gm(g[g['workload'] == w]['ratio']):.3f}" for w in sorted(df["workload"].unique())]
        rows.append(
            f"| {label} | {gm(g['ratio']):.3f} | {g['reached_target'].mean():.0%} | " + " | ".join(per) + " |"
        )
    return "\n".join(rows)


def run(cfg: DictConfig) -> pd.DataFrame:
    seeds = [int(s) for s in cfg.seeds]
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    controllers = _controllers(cfg)
    reference = next(iter(controllers))
    rows = []
    for workers in cfg.workers:
        domain = build_domain(cfg, int(workers))
        for label, spec in controllers.items():
            kwargs = dict(spec)
            ctrl = make_controller(kwargs.pop("name"), **kwargs)
            for seed in seeds:
                # the world from the seed alone (the same for every controller), one env per world
                world = domain.sample(np.random.default_rng(seed))
                env = HeteroClusterEnv(
                    backend=SimBackend(**world),
                    action_mode=ctrl.action_mode,
                    interval=int(cfg.interval),
                    reward=plain(cfg.reward),
                    max_decisions=cfg.max_decisions,
                    **env_options(ctrl),
                )
                result = run_episode(env, ctrl, seed)
                rows.append(
                    {
                        **{
                            k: result.summary[k]
                            for k in ("time_to_accuracy_s", "total_time_s", "reached_target")
                        },
                        "label": label,
                        "workers": int(workers),
                        "seed": seed,
                        "workload": getattr(world["workload"], "name", world["workload"]),
                        "cluster": world["cluster"].name,
                        "scenario": world["scenario"].name,
                        "decisions": result.summary["decisions"],
                    }
                )
                env.close()
            done = [r for r in rows if r["label"] == label and r["workers"] == int(workers)]
            log.info(
                "%s on %d workers: %d worlds, %d reached",
                label,
                workers,
                len(done),
                sum(r["reached_target"] for r in done),
            )
    return score_runs(pd.DataFrame(rows), reference)


@hydra.main(version_base=None, config_path="../conf", config_name="generated_eval")
def main(cfg: DictConfig) -> float:
    df = run(cfg)
    out = Path(to_absolute_path(str(cfg.out_dir)))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "runs.csv", df.to_csv(index=False))
    table = summary_table(df)
    cmd = "python -m experiments.generated_eval " + " ".join(
        hydra.core.hydra_config.HydraConfig.get().overrides.task
    )
    reference = str(df["label"].iloc[0])  # run() drives the reference first
    text = (
        f"# Generated worlds: {cfg.label}\n\n`{cmd}`\n\nDomain: `{cfg.domain_from}` with overrides "
        f"{json.dumps(plain(cfg.domain_overrides or {}))}; workers {list(cfg.workers)}; seeds {list(cfg.seeds)}; "
        f"reference {reference}.\n\n{table}\n"
    )
    atomic_write_text(out / "summary.md", text)
    print(table)
    gms = df[df["label"] != reference].groupby("label")["ratio"].apply(lambda x: math.exp(np.log(x).mean()))
    return float(gms.min()) if len(gms) else 1.0


if __name__ == "__main__":
    main()
