"""experiments.elastic_policy_real end to end (slow): a fixed allocation and the shipped CPU-pool PPO
bundle, in simulation and on one real run each, through the same env; the table says both."""

from __future__ import annotations

import csv
import json

import pytest
from support import ROOT, run_app

BUNDLE = ROOT / "results" / "elastic" / "bundles" / "ppo_cpu"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not BUNDLE.is_dir(), reason="needs the shipped bundle results/elastic/bundles/ppo_cpu")
def test_the_app_runs_controllers_on_real_ranks_and_in_simulation(tmp_path):
    out = tmp_path / "out"
    controllers = (
        "controllers=[{name: hold_1, kind: fixed, counts: {cpu/on_demand: 1}},"
        "{name: grow_to_2, kind: fixed_target, counts: {cpu/on_demand: 2}},"
        f"{{name: ppo, kind: learned, algo: ppo, bundle: {BUNDLE}}}]"
    )
    proc = run_app(
        "experiments.elastic_policy_real",
        "real_seeds=[0]",
        "sim_seeds=[0,1]",
        f"out_dir={out}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        controllers,
        "plot_controllers=[ppo,grow_to_2]",
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["controller"]: r for r in csv.DictReader(open(out / "table.csv"))}
    assert set(rows) == {"hold_1", "grow_to_2", "ppo"}
    for r in rows.values():
        assert r["sim_reached"] == "2/2" and r["real_reached"] == "1/1"
        assert float(r["real_time_s"]) > 0 and float(r["real_dollars"]) > 0
    assert float(rows["grow_to_2"]["real_restarts"]) == 1 and float(rows["grow_to_2"]["real_restart_s"]) > 0
    assert float(rows["hold_1"]["real_restarts"]) == 0
    episodes = list(csv.DictReader(open(out / "episodes.csv")))
    assert sorted({e["backend"] for e in episodes}) == ["real", "sim"] and len(episodes) == 3 * 3
    assert json.loads((out / "summary.json").read_text())["pool"] == "cpu_local"
    timeline = list(csv.DictReader(open(out / "timeline.csv")))
    assert {t["controller"] for t in timeline} == {"ppo", "grow_to_2"}
    assert max(int(t["gpus"]) for t in timeline if t["controller"] == "grow_to_2") == 2
    assert (out / "workers_spend.png").stat().st_size > 1000
