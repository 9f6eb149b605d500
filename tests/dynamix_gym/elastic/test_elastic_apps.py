"""The elastic entry points run as a user runs them, with tiny budgets."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest
from support import run_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return run_python(["-m", *args], timeout=170)


def test_the_elastic_table_app_writes_its_table_and_plot(tmp_path):
    proc = _run(
        [
            "experiments.elastic",
            f"out_dir={tmp_path}",
            "seeds=[0]",
            "hindsight.enabled=false",
            "plot_controllers=[t4_spot_4,goodput_per_dollar]",
            "controllers=[{name: t4_spot_4, kind: fixed, counts: {T4/spot: 4}}, {name: goodput_per_dollar, kind: goodput_per_dollar, params: {threshold: 20.0}}]",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "table.csv")))
    assert [r["controller"] for r in rows] == ["t4_spot_4", "goodput_per_dollar"]
    assert all(float(r["dollars_to_accuracy"]) > 0 and r["reached"] == "1" for r in rows)
    assert (tmp_path / "workers_spend.png").stat().st_size > 0
    timeline = list(csv.DictReader(open(tmp_path / "timeline.csv")))
    assert {"gpus", "spend_usd", "wall_time_s"} <= set(timeline[0])


@pytest.mark.slow
def test_the_training_app_trains_an_elastic_learner(tmp_path):
    proc = _run(
        [
            "experiments.train",
            "experiment=train_elastic_ppo",
            f"run_dir={tmp_path}",
            "elastic.total_timesteps=128",
            "elastic.eval_every=128",
            "elastic.n_envs=2",
            "elastic.eval_seeds=[100]",
            "elastic.expert_pretrain.episodes=1",
            "elastic.expert_pretrain.epochs=1",
            "elastic.algo_kwargs.n_steps=64",
            "elastic.algo_kwargs.batch_size=64",
            "+elastic.env.max_decisions=10",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ]
    )
    # A 128-step policy may miss the target within 10 decisions: the app then says so and exits 1.
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["algo"] == "ppo" and summary["timesteps"] >= 128, proc.stderr[-3000:]
    assert (tmp_path / "best" / "bundle.json").is_file()
    meta = json.loads((tmp_path / "best" / "bundle.json").read_text())["metadata"]
    assert meta["env_id"] == "dynamix/ElasticCluster-v0" and meta["action_form"] == "multidiscrete"
