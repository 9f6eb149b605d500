"""The pipeline bench's report: a table and a figure from ``results/pipeline/bench.json``.

    python -m experiments.pipeline_report [results/pipeline/bench.json [more rows.json ...]]

Writes ``bench.md`` (per scenario, the geometric mean of each controller's time to the target over
the limit's, and the tasks each reached; then the done-means ratios over the tasks every side
reached) and ``bench.png`` (the same as bars) beside the first JSON. Rows of further files (e.g.
the policy's own run, ``bench_policy.json``) join by scenario and seed. Every figure is computed
from the saved rows.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from experiments.common import REPO_ROOT

ORDER = ("even", "pipedream", "dynpipe", "greedy_gain", "policy", "hindsight_limit")


def table(rows: list[dict]) -> tuple[list[str], list[str], dict[tuple[str, str], tuple[float, int, int]]]:
    """(scenarios, controllers, {(scenario, controller): (geo-mean TTA / limit, reached, tasks)})."""
    by: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        t = r["time_to_target_s"]
        by.setdefault((r["scenario"], r["seed"]), {})[r["controller"]] = math.inf if t is None else float(t)
    scenarios = sorted({k[0] for k in by})
    ctrls = [c for c in ORDER if any(c in t for t in by.values())]
    cells = {}
    for sc in scenarios:
        tasks = [t for (s, _), t in by.items() if s == sc]
        for c in ctrls:
            ratios = [
                t[c] / t["hindsight_limit"]
                for t in tasks
                if c in t and math.isfinite(t.get("hindsight_limit", math.inf))
            ]
            finite = [x for x in ratios if math.isfinite(x)]
            geo = float(np.exp(np.mean(np.log(finite)))) if finite else math.nan  # the tasks it reached
            limit_reached = [t for t in tasks if math.isfinite(t.get("hindsight_limit", math.inf))]
            cells[(sc, c)] = (
                geo,
                sum(math.isfinite(t.get(c, math.inf)) for t in limit_reached),
                len(limit_reached),
            )
    return scenarios, ctrls, cells


def pair_ratios(rows: list[dict], a: str, b: str, scenarios: set[str] | None = None) -> dict[str, float]:
    """Geometric mean and max of TTA(a) / TTA(b) over the tasks both reached, and how many."""
    by: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        t = r["time_to_target_s"]
        by.setdefault((r["scenario"], r["seed"]), {})[r["controller"]] = math.inf if t is None else float(t)
    vals = [t[a] / t[b] for (sc, _), t in by.items() if a in t and b in t and (scenarios is None or sc in scenarios)
            and math.isfinite(t[a]) and math.isfinite(t[b])]  # fmt: skip
    both = [t for (sc, _), t in by.items() if a in t and b in t and (scenarios is None or sc in scenarios)]
    return {
        "geo_mean": float(np.exp(np.mean(np.log(vals)))) if vals else math.nan,
        "max": max(vals) if vals else math.nan,
        "tasks_both_reached": len(vals),
        "tasks": len(both),
    }


def render(path: Path, extra: list[Path] = ()) -> None:
    data = json.loads(path.read_text())
    rows = list(data["rows"])
    for e in extra:
        rows += json.loads(Path(e).read_text())["rows"]
    scenarios, ctrls, cells = table(rows)
    lines = ["| scenario | " + " | ".join(ctrls) + " |", "|---|" + "---|" * len(ctrls)]
    for sc in scenarios:
        vals = []
        for c in ctrls:
            geo, reached, n = cells[(sc, c)]
            vals.append(f"{geo:.3f} ({reached}/{n})" if math.isfinite(geo) else f"n/a ({reached}/{n})")
        lines.append(f"| {sc} | " + " | ".join(vals) + " |")
    note = ("Geometric mean, over the scenario's test tasks the controller reached the target on, of its time "
            "to the target over the hindsight limit's (1 = the limit); in brackets the tasks it reached of those "
            "the limit reached (a miss is not in the mean: read the two together).")  # fmt: skip
    checks = [
        ("even", "dynpipe", {"interference"}),
        ("even", "dynpipe", None),
        ("dynpipe", "pipedream", None),
    ]
    if "greedy_gain" in ctrls:
        checks += [("greedy_gain", "dynpipe", None), ("greedy_gain", "hindsight_limit", None)]
    if "policy" in ctrls:
        checks += [("policy", "dynpipe", None), ("policy", "hindsight_limit", None)]
    if "policy" in ctrls and "greedy_gain" in ctrls:
        checks += [("policy", "greedy_gain", None)]
    lines += ["", note, "", "| ratio of times to the target | scenarios | geometric mean | max | tasks both reached |",
              "|---|---|---|---|---|"]  # fmt: skip
    for a, b, scs in checks:
        r = pair_ratios(rows, a, b, scs)
        lines.append(f"| {a} / {b} | {'all' if scs is None else ', '.join(sorted(scs))} | {r['geo_mean']:.3f} | "
                     f"{r['max']:.3f} | {r['tasks_both_reached']} of {r['tasks']} |")  # fmt: skip
    beaten = [
        f"{r['controller']} on {r['scenario']} seed {r['seed']}"
        for r in rows
        if r["controller"] != "hindsight_limit"
        and r["time_to_target_s"] is not None
        and any(
            q["controller"] == "hindsight_limit" and q["scenario"] == r["scenario"] and q["seed"] == r["seed"]
            and (q["time_to_target_s"] is None or r["time_to_target_s"] < q["time_to_target_s"] - 1e-6)
            for q in rows
        )
    ]  # fmt: skip
    lines += ["", f"Hindsight limit beaten on: {', '.join(beaten) if beaten else 'no task'}."]
    (path.parent / "bench.md").write_text("\n".join(lines) + "\n")
    fig = Figure(figsize=(8, 3.5))
    ax = fig.subplots()
    w = 0.8 / max(len(ctrls), 1)
    for i, c in enumerate(ctrls):
        ys = [cells[(sc, c)][0] for sc in scenarios]
        ax.bar(np.arange(len(scenarios)) + i * w, [y if math.isfinite(y) else 0 for y in ys], w, label=c)
    ax.set_xticks(np.arange(len(scenarios)) + 0.4 - w / 2, scenarios)
    ax.set_ylabel("time to target / limit (geo. mean)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path.parent / "bench.png", dpi=120)


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]] or [REPO_ROOT / "results" / "pipeline" / "bench.json"]
    render(args[0], args[1:])
