"""The policy library's report (experiments.policy_report) from training summaries."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from support import CONF

from experiments.policy_report import policy_report_app


def _summary(path, scores):
    path.mkdir(parents=True)
    history = [{"timesteps": t, "mean_tta_s": v, "tta_s": {"a": v, "b": 2 * v}} for t, v in scores]
    (path / "train_summary.json").write_text(json.dumps({"history": history, "timesteps": scores[-1][0],
                                                         "train_seconds": 120.0}))  # fmt: skip


def _config(tmp_path, overrides):
    """The report's config writing under ``tmp_path / "out"``, its runs replaced by ``overrides``."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("policy_report", overrides=[f"out_dir={tmp_path / 'out'}", "~runs", *overrides])


def test_the_report_says_whether_rl_beat_the_warm_start(tmp_path):
    _summary(tmp_path / "better", [(0, 600.0), (100, 540.0), (200, 570.0)])
    _summary(tmp_path / "worse", [(0, 600.0), (100, 660.0)])
    _summary(tmp_path / "imitation", [(0, 600.0), (0, 600.0)])  # warm start alone (total_timesteps=0)
    cfg = _config(tmp_path, [
        f"+runs.better={{run_dir: {tmp_path / 'better'}, command: x, description: d}}",
        f"+runs.worse={{run_dir: {tmp_path / 'worse'}, command: y, description: e}}",
        f"+runs.imitation={{run_dir: {tmp_path / 'imitation'}, command: z, description: f}}",
    ])  # fmt: skip
    policy_report_app(cfg)
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| better | 200 | 2 | 10.00 | 9.00 (step 100) | 9.50 | yes |" in md
    assert "| worse | 100 | 2 | 10.00 | 10.00 (step 0) | 11.00 | **no** |" in md
    assert "| imitation | 0 | 2 | 10.00 | 10.00 (step 0) | 10.00 | - (no PPO) |" in md
    assert (tmp_path / "out" / "learning_curve.png").stat().st_size > 0
    # a fresh checkout has no run folders: the report re-renders from the runs.json it wrote
    for name in ("better", "worse", "imitation"):
        (tmp_path / name / "train_summary.json").unlink()
    policy_report_app(cfg)
    assert (tmp_path / "out" / "README.md").read_text() == md
    with pytest.raises(FileNotFoundError, match="train the run first"):
        from experiments.policy_report import load_run

        load_run(tmp_path / "missing")


def test_the_ablation_table_reads_a_committed_benchmark_summary_over_the_recorded_score(tmp_path):
    _summary(tmp_path / "run", [(0, 600.0)])
    bench = tmp_path / "ablation" / "train"
    bench.mkdir(parents=True)
    (bench / "summary.json").write_text(json.dumps({"geomean_ratio_to_limit": 1.2345}))
    cfg = _config(tmp_path, [
        "~ablation",
        f"+runs.run={{run_dir: {tmp_path / 'run'}, command: x, description: d}}",
        f"+ablation=[{{component: critic, variant: v, summary: {bench / 'summary.json'}, run: run, verdict: worse}},"
        "{component: reward, variant: w, train_x_limit: 1.5, verdict: better},"
        "{component: split, variant: u, verdict: collapsed}]",
    ])  # fmt: skip
    policy_report_app(cfg)
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| critic | v | 1.234 | run | worse |" in md
    assert "| reward | w | 1.500 | - | better |" in md
    assert "| split | u | - | - | collapsed |" in md
