"""The RL ablation's report (experiments.rl_report) from training and benchmark summaries."""

from __future__ import annotations

import csv
import json

import pytest
from hydra import compose, initialize_config_dir
from support import CONF

from experiments.rl_report import rl_report_app


def _run(tmp_path, label, scores, train_x, worst=1.3):
    run = tmp_path / "runs" / label
    run.mkdir(parents=True)
    history = [{"timesteps": t, "mean_tta_s": v, "tta_s": {"a": v, "b": 2 * v}} for t, v in scores]
    (run / "train_summary.json").write_text(json.dumps({"history": history, "timesteps": scores[-1][0]}))
    bench = tmp_path / "bench" / label / "train"
    bench.mkdir(parents=True)
    (bench / "summary.json").write_text(
        json.dumps(
            {
                "geomean_ratio_to_limit": train_x,
                "worst_task": "b",
                "worst_task_ratio": worst,
                "reached_share": 1.0,
            }
        )
    )
    return f"{{label: {label}, seed: 0, run_dir: {run}, command: c}}"


def _config(tmp_path, arms):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            "rl_report",
            overrides=[f"out_dir={tmp_path / 'out'}", f"benchmark_root={tmp_path / 'bench'}", "baseline_arm=ws",
                       f"arms=[{','.join(arms)}]"],
        )  # fmt: skip


def test_an_arm_is_ahead_only_by_more_than_its_seed_spread(tmp_path):
    ws = _run(tmp_path, "ws", [(0, 600.0)], 1.20)
    good = [
        _run(tmp_path, f"g{i}", [(0, 600.0), (100, 540.0 + i)], x) for i, x in enumerate((1.10, 1.11, 1.12))
    ]
    wide = [_run(tmp_path, f"w{i}", [(0, 600.0), (100, 660.0)], x) for i, x in enumerate((1.05, 1.19))]
    worse = [_run(tmp_path, f"b{i}", [(0, 600.0)], x) for i, x in enumerate((1.25, 1.26))]
    cfg = _config(tmp_path, [
        f"{{name: ws, description: d, runs: [{ws}]}}",
        f"{{name: good, description: e, runs: [{','.join(good)}]}}",
        f"{{name: wide, description: f, runs: [{','.join(wide)}]}}",
        f"{{name: worse, description: g, runs: [{','.join(worse)}]}}",
    ])  # fmt: skip
    stats = rl_report_app(cfg)
    assert stats["good"]["spread"] == pytest.approx(0.02) and stats["good"]["mean"] == pytest.approx(1.11)
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| good | 3 | 1.110 | 1.100 - 1.120 | 0.020 | 1.30 | 100% | ahead by 0.090 > its spread |" in md
    assert (
        "| wide | 2 | 1.120 | 1.050 - 1.190 | 0.140 | 1.30 | 100% | within its spread (-0.080 against the baseline) |"
        in md
    )
    assert "| worse | 2 | 1.255 | 1.250 - 1.260 | 0.010 | 1.30 | 100% | behind by 0.055 > its spread |" in md
    assert "| good | g1 | 0 | 100 | 10.00 (0) | 9.02 | 1.110 | b 1.30x |" in md
    rows = list(csv.DictReader((tmp_path / "out" / "curves.csv").open()))
    assert len(rows) == 1 + 3 * 2 + 2 * 2 + 2 and rows[1]["b_min"] == "20.0"
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0
    # a fresh checkout has neither the run folders nor the benchmark's: the committed copies serve
    for p in (tmp_path / "runs").rglob("train_summary.json"):
        p.unlink()
    for p in (tmp_path / "bench").rglob("summary.json"):
        p.unlink()
    rl_report_app(cfg)
    assert (tmp_path / "out" / "README.md").read_text() == md
    cfg.arms[0].runs[0].label = "never_ran"
    with pytest.raises(FileNotFoundError, match="run it first"):
        rl_report_app(cfg)


def test_a_run_stopped_by_hand_is_read_from_its_validation_scalars_up_to_the_budget(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "runs" / "stopped"
    writer = SummaryWriter(str(run / "tb" / "ppo_1"))
    for step, a in ((500, 2.0), (1000, 1.0), (1500, 0.5)):
        writer.add_scalar("eval/tta_min_a", a, step)
        writer.add_scalar("eval/tta_min_b", 4 * a, step)
        writer.add_scalar("eval/tta_min_mean", 99.0, step)  # recomputed, not read
    writer.close()
    bench = tmp_path / "bench" / "stopped" / "train"
    bench.mkdir(parents=True)
    (bench / "summary.json").write_text(
        json.dumps(
            {"geomean_ratio_to_limit": 1.1, "worst_task": "b", "worst_task_ratio": 1.2, "reached_share": 1.0}
        )
    )
    arm = f"{{name: ws, description: d, runs: [{{label: stopped, seed: 0, run_dir: {run}, max_steps: 1000, command: c}}]}}"
    rl_report_app(_config(tmp_path, [arm]))
    saved = json.loads((tmp_path / "out" / "runs" / "stopped.json").read_text())
    assert [p["timesteps"] for p in saved["history"]] == [500, 1000] and saved["stopped_after_steps"] == 1000
    assert saved["history"][1]["mean_tta_s"] == pytest.approx(60.0 * 2.0)  # geomean of 1 and 4 minutes
    assert saved["history"][0]["tta_s"] == pytest.approx({"a": 120.0, "b": 480.0})


def test_a_run_with_neither_folder_nor_copy_is_read_back_from_the_committed_curves(tmp_path):
    ws = _run(tmp_path, "ws", [(0, 600.0), (100, 540.0)], 1.20)
    cfg = _config(tmp_path, [f"{{name: ws, description: d, runs: [{ws}]}}"])
    rl_report_app(cfg)
    out = tmp_path / "out"
    md, curves = (out / "README.md").read_text(), (out / "curves.csv").read_text()
    # a checkout from before the copies were kept: the run folder and the copy are both gone
    (tmp_path / "runs" / "ws" / "train_summary.json").unlink()
    (out / "runs" / "ws.json").unlink()
    rl_report_app(cfg)
    assert (out / "README.md").read_text() == md and (out / "curves.csv").read_text() == curves
    saved = json.loads((out / "runs" / "ws.json").read_text())
    assert saved["from"] == "curves.csv" and [p["timesteps"] for p in saved["history"]] == [0, 100]
    assert saved["history"][1]["tta_s"] == pytest.approx({"a": 540.0, "b": 1080.0})
    # without the curves either, it is an error that names what to do
    (out / "runs" / "ws.json").unlink()
    (out / "curves.csv").unlink()
    with pytest.raises(FileNotFoundError, match="run it first"):
        rl_report_app(cfg)
