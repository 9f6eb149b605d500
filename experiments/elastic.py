"""Time and dollars to accuracy per controller on an elastic pool, on held-out seeds.

    python -m experiments.elastic                                  # conf/elastic.yaml
    python -m experiments.elastic seeds=[100,101,102] out_dir=results/elastic_tune

Runs every controller of ``controllers`` (fixed allocations, the goodput-per-dollar rule, the pool
oracle, learned bundles) and, when ``hindsight.enabled``, the hindsight-best fixed allocation per
seed (every allocation of ``hindsight.counts`` GPUs per offer, the cheapest that reaches the target
within ``hindsight.time_factor`` x the fastest fixed allocation's time on that seed: row
``hindsight_fixed``, held from t = 0) and, with ``hindsight.from_initial``, the same search over
the switch-once schedules that start on the pool's initial allocation and move to the grid's at
the first decision (row ``hindsight_switch``). Writes
``table.csv`` / ``table.md`` (means over seeds), ``episodes.csv`` (one row per controller x seed),
``timeline.csv`` (worker count and spend per step of ``plot_controllers`` on ``plot_seed``) and
``workers_spend.png``. Returns the best learned policy's mean dollars to accuracy.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.elastic.baselines import FixedAllocation, make_elastic_controller
from dynamix_gym.elastic.evaluation import run_elastic_episode
from dynamix_gym.elastic.hindsight import hindsight_fixed_allocation
from dynamix_gym.elastic.training import load_elastic_bundle
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from sim.datafiles import atomic_write_text

log = logging.getLogger(__name__)

COLUMNS = (
    "controller",
    "kind",
    "seeds",
    "reached",
    "time_to_accuracy_s",
    "dollars_to_accuracy",
    "mean_gpus",
    "restarts",
    "preemptions",
)


def _controller(
    spec: dict[str, Any], env_kwargs: dict[str, Any], lr_multiplier: float = 1.0
) -> tuple[Any, dict[str, Any]]:
    """(controller, env kwargs) of one entry of ``controllers``; a baseline runs at the entry's
    ``lr_multiplier`` or else ``lr_multiplier`` (a learned policy picks its own)."""
    kind = spec["kind"]
    kw = {**env_kwargs, **spec.get("env", {})}
    lr = float(spec.get("lr_multiplier", lr_multiplier))
    if kind == "fixed":
        counts = dict(spec["counts"])
        return FixedAllocation(counts, label=spec["name"]).set_lr(lr), {**kw, "initial_allocation": counts}
    if kind == "fixed_target":  # the same target, reached from the pool's initial allocation
        return FixedAllocation(dict(spec["counts"]), label=spec["name"]).set_lr(lr), kw
    if kind == "learned":
        algo_form = {"ppo": "multidiscrete", "sac": "box", "td3": "box"}[spec["algo"]]
        kw = {**kw, "action_form": algo_form}
        return load_elastic_bundle(to_absolute_path(spec["bundle"]), ElasticClusterEnv(**kw)), kw
    return make_elastic_controller(kind, lr_multiplier=lr, **spec.get("params", {})), kw


def controllers(specs: list[dict[str, Any]], env_kwargs: dict[str, Any], lr_multiplier: float = 1.0):
    """(entry, controller, env kwargs) of every entry of ``specs`` (see :func:`_controller`); a learned
    entry whose bundle is missing is skipped with a warning."""
    for spec in specs:
        if spec["kind"] == "learned" and not Path(to_absolute_path(spec["bundle"])).is_dir():
            log.warning("skipping %s: no bundle at %s", spec["name"], spec["bundle"])
            continue
        yield (spec, *_controller(spec, env_kwargs, lr_multiplier))


def host_record(load_start: list[float]) -> dict[str, Any]:
    """The host a real measurement ran on: cores, the load average at its start and end, the time."""
    return {
        "cpu_count": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _summary(name: str, kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in rows]))

    return {
        "controller": name,
        "kind": kind,
        "seeds": len(rows),
        "reached": sum(r["reached_target"] for r in rows),
        "time_to_accuracy_s": mean("time_to_accuracy_s"),
        "dollars_to_accuracy": mean("dollars_to_accuracy"),
        "mean_gpus": mean("mean_gpus"),
        "restarts": mean("restarts"),
        "preemptions": mean("preemptions"),
    }


def _hindsight(
    cfg: dict[str, Any],
    env_kwargs: dict[str, Any],
    seeds: list[int],
    fastest: dict[int, float],
    lr: float = 1.0,
    from_initial: bool = False,
):
    """Per seed, the cheapest allocation (from the grid) within the time factor, held from t = 0 or
    (``from_initial``) reached from the pool's initial allocation at the first decision; a seed on
    which none of the grid is in time has no row (the summary's ``seeds`` counts those that do)."""
    rows, form = [], "hindsight (from initial)" if from_initial else "hindsight"
    for seed in seeds:
        limit = cfg["time_factor"] * fastest[seed]
        best = hindsight_fixed_allocation(
            env_kwargs, seed, cfg["counts"], limit, lr_multiplier=lr, from_initial=from_initial
        )
        if best is None:
            log.info("%s seed %d: no allocation in time", form, seed)
        else:
            rows.append(best)
            log.info("%s seed %d: %s", form, seed, best["allocation"])
    return rows


def run(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    out = Path(to_absolute_path(raw["out_dir"]))
    env_kwargs = dict(raw["env"])
    seeds = [int(s) for s in raw["seeds"]]
    table, episodes, timelines = [], [], []
    fastest_fixed: dict[int, float] = {}
    baseline_lr = float(raw.get("baseline_lr_multiplier", 1.0))  # every baseline's constant multiplier
    for spec, ctl, kw in controllers(raw["controllers"], env_kwargs, baseline_lr):
        name = spec["name"]
        rows = []
        for seed in seeds:
            r = run_elastic_episode(ElasticClusterEnv(**kw), ctl, seed)
            rows.append(r)
            episodes.append(
                {"controller": name, "seed": seed, **{k: v for k, v in r.items() if k != "history"}}
            )
            if spec["kind"] == "fixed":
                fastest_fixed[seed] = min(fastest_fixed.get(seed, math.inf), r["time_to_accuracy_s"])
            if seed == raw["plot_seed"] and name in raw["plot_controllers"]:
                timelines += [{"controller": name, **h} for h in r["history"]]
        table.append(_summary(name, spec["kind"], rows))
        log.info("%s: %s", name, table[-1])
    hs = raw.get("hindsight") or {}
    if hs.get("enabled") and fastest_fixed:
        forms = [("hindsight_fixed", False)]
        if hs.get("from_initial"):
            forms.append(("hindsight_switch", True))
        for name, from_initial in forms:
            rows = _hindsight(hs, env_kwargs, seeds, fastest_fixed, baseline_lr, from_initial)
            if rows:
                table.append(_summary(name, "hindsight", rows))
            else:
                log.info("%s: no allocation of the grid reaches the target in time on any seed", name)
    _write(out, table, episodes, timelines)
    learned = [t["dollars_to_accuracy"] for t in table if t["kind"] == "learned"]
    return min(learned) if learned else math.nan


def csv_text(rows: list[dict[str, Any]], columns: list[str] | tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _write(out: Path, table, episodes, timelines) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.csv", csv_text(table, COLUMNS))
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for t in table:
        cells = [f"{t[c]:.3f}" if isinstance(t[c], float) else str(t[c]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    if episodes:
        atomic_write_text(out / "episodes.csv", csv_text(episodes, list(episodes[0])))
    if timelines:
        cols = sorted({k for t in timelines for k in t}, key=lambda k: (k != "controller", k))
        atomic_write_text(out / "timeline.csv", csv_text(timelines, cols))
        plot_workers_spend(out / "workers_spend.png", timelines)


def plot_workers_spend(
    path: Path,
    timelines: list[dict[str, Any]],
    title: str = "seed 0 (held out): GPUs held and dollars spent",
    seconds_per_unit: float = 60.0,
    unit: str = "min",
    ylabel: str = "GPUs held",
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    styles = ("-", "--", ":", "-.")
    for i, name in enumerate(dict.fromkeys(t["controller"] for t in timelines)):
        rows = [t for t in timelines if t["controller"] == name]
        x = [r["wall_time_s"] / seconds_per_unit for r in rows]
        ls, lw = styles[i % len(styles)], 2.5 - 0.5 * (i % 3)
        ax1.step(x, [r["gpus"] for r in rows], where="post", label=name, linestyle=ls, linewidth=lw)
        ax2.plot(x, [r["spend_usd"] for r in rows], label=name, linestyle=ls, linewidth=lw)
    ax1.set_ylabel(ylabel)
    ax1.set_title(title)
    ax2.set_ylabel("spend ($)")
    ax2.set_xlabel(f"wall time ({unit})")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


@hydra.main(version_base=None, config_path="../conf", config_name="elastic")
def main(cfg: DictConfig) -> float:
    return run(cfg)


if __name__ == "__main__":
    main()
