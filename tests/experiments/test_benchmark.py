"""dynamix-bench-v1: the suite's rules, the hindsight limit, and experiments.benchmark end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from support import ROOT, run_app

import dynamix_gym  # noqa: F401
from dynamix_gym.benchmark import check_suite, split_tasks, task_specs
from dynamix_gym.controllers.hindsight import HindsightController, ScheduleController, make_candidate
from dynamix_gym.controllers.registry import CONTROLLERS, make_controller
from dynamix_gym.evaluation import run_episode

V1 = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "benchmark" / "v1.yaml"))
#: A search small enough for a unit test, still with every candidate family.
QUICK = dict(budget=20_000, cem_iterations=2, cem_population=4, cem_elites=2)


def _env(task: dict, action_mode: str):
    specs = task_specs(task, {"kind": "dynamix"})
    return gym.make(
        "dynamix/HeteroCluster-v0", **specs, action_mode=action_mode, interval=int(task.get("interval", 50))
    )


def _tta(result) -> float:
    s = result.summary
    return s["time_to_accuracy_s"] if s["reached_target"] else math.inf


# --- the suite ------------------------------------------------------------------------------------
def test_v1_suite_follows_its_rules():
    check_suite(V1)
    train, _ = split_tasks(V1, "train")
    test, _ = split_tasks(V1, "test")
    workloads = {t["workload"] for t in test.values()} | {t["workload"] for t in train.values()}
    assert workloads == {"cifar10", "imagenet", "bert", "ncf", "cifar100_resnet34"}
    scenarios = {t["scenario"] for s in (train, test) for t in s.values()}
    for family in ("static_hetero", "throttle", "jitter", "interference", "mixed"):
        assert family in scenarios
    for family in ("loss_rejoin", "congestion_windows", "short_throttles", "starved_input"):
        assert family in scenarios
    sizes = {task_specs(t, {"kind": "dynamix"})["cluster"].num_workers for t in test.values()}
    assert min(sizes) <= 8 and max(sizes) == 64


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b["splits"]["test"].update(seeds=[100]), "in both the train and the test split"),
        (
            lambda b: b["splits"]["test"]["tasks"].update(
                copy=dict(b["splits"]["train"]["tasks"]["cifar10_t4v100_static"])
            ),
            "repeats a train task",
        ),
        (lambda b: b["splits"]["test"]["tasks"].update(bad={"workload": "cifar10"}), "missing keys"),
        (
            lambda b: b["splits"]["test"]["tasks"].update(
                bad={"workload": "cifar10", "cluster": "t4v100", "scenario": "nope"}
            ),
            "scenario 'nope' has no config",
        ),
        (lambda b: b["splits"].pop("test"), "no split 'test'"),
    ],
)
def test_suite_rules_are_enforced(edit, message):
    bench = json.loads(json.dumps(V1))
    edit(bench)
    with pytest.raises(ValueError, match=message):
        check_suite(bench)


# --- the hindsight limit --------------------------------------------------------------------------
#: Small tasks (4 workers, quick workloads) on which every controller is raced against the limit.
LIMIT_GRID = [
    {"workload": "cifar10", "cluster": "t4v100_4", "scenario": "throttle"},
    {"workload": "ncf", "cluster": "t4v100_4", "scenario": "static_hetero"},
    {"workload": "cifar10", "cluster": "t4v100_4", "scenario": "loss_rejoin"},
]
#: Controllers raced against the limit (the greedy oracle included; random is a floor, not a rival).
RIVALS = [name for name in CONTROLLERS if name not in ("hindsight", "random", "static")]


@pytest.mark.parametrize(
    "task",
    [pytest.param(t, marks=() if i == 1 else pytest.mark.slow) for i, t in enumerate(LIMIT_GRID)],
    ids=lambda t: f"{t['workload']}-{t['scenario']}",
)
def test_hindsight_is_never_beaten(task):
    seed = 7
    limit_ctrl = HindsightController(**QUICK)
    limit = _tta(run_episode(_env(task, "absolute"), limit_ctrl, seed))
    assert math.isfinite(limit)
    # The scored episode replays the plan: its time is the search's best score.
    assert limit == pytest.approx(limit_ctrl.search_log["score"], rel=1e-12)
    rivals = {name: make_controller(name) for name in RIVALS}
    rivals |= {f"static-{b}": make_controller("static", batch=b) for b in (32, 128, 512, 2048)}
    rivals["oracle-time-to-target"] = make_controller("oracle", objective="time_to_target", batch_penalty=0.0)
    # ... and static jobs that start at their batch, as the benchmark's grid does (65536: every
    # worker at its memory cap).
    rivals |= {
        f"static-{b}-from-start": make_controller("static", batch=b, start_at_batch=True)
        for b in (32, 512, 65536)
    }
    for name, ctrl in rivals.items():
        tta = _tta(run_episode(_env(task, ctrl.action_mode), ctrl, seed))
        assert limit <= tta * (1 + 1e-12), (
            f"{name} reached the target in {tta:.1f} s, before the limit's {limit:.1f} s"
        )


def test_hindsight_caches_and_replays_its_plan(tmp_path):
    task = LIMIT_GRID[1]
    first = HindsightController(**{**QUICK, "budget": 4_000}, cache_dir=tmp_path)
    tta = _tta(run_episode(_env(task, "absolute"), first, 3))
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert (
        record["plan"] == first.search_log["plan"]
        and record["candidates"] >= 2
        and record["own_start_statics"]
        and set(record["time_to_target_oracles"]) == {str(g) for g in first.oracle_min_gains}
    )
    again = HindsightController(**{**QUICK, "budget": 4_000}, cache_dir=tmp_path, time_limit_s=1e-6)
    assert _tta(run_episode(_env(task, "absolute"), again, 3)) == tta
    replayed = HindsightController(plan=record["plan"])
    assert _tta(run_episode(_env(task, "absolute"), replayed, 3)) == tta
    other_seed = HindsightController(**{**QUICK, "budget": 4_000}, cache_dir=tmp_path)
    run_episode(_env(task, "absolute"), other_seed, 4)
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_schedule_follows_its_knots_and_splits_by_compute_time():
    task = {"workload": "cifar10", "cluster": "t4v100_4", "scenario": "static_hetero"}
    env = _env(task, "absolute")
    ctrl = ScheduleController(knots_log2=[10.0] * 6, progress_scale=1e4, tol_log2=0.1)
    result = run_episode(env, ctrl, 0, max_steps=5)
    last = result.timeline[-1]
    batches = np.array([last[f"w{i}_batch"] for i in range(4)])
    assert batches.sum() == 1024
    compute = np.array([last[f"w{i}_compute_time_s"] for i in range(4)])
    assert compute.max() / compute.min() < 1.15  # T4s and V100s finish together
    assert batches[:2].sum() != batches[2:].sum()  # uneven: the faster type takes more


def test_hindsight_needs_truth_and_a_prepare():
    ctrl = HindsightController(**QUICK)
    env = _env(LIMIT_GRID[0], "absolute")
    with pytest.raises(RuntimeError, match="prepare"):
        ctrl.reset(env.unwrapped.backend.spec)
    with pytest.raises(ValueError, match="cem_elites"):
        HindsightController(cem_population=2, cem_elites=3)
    with pytest.raises(ValueError, match="time_limit_s"):
        HindsightController(time_limit_s=0)
    with pytest.raises(ValueError, match="unknown hindsight candidate kind"):
        make_candidate({"kind": "nope"})
    with pytest.raises(ValueError, match="knots_log2"):
        ScheduleController(knots_log2=[1.0, 2.0], progress_scale=1.0)


# --- the app end to end ---------------------------------------------------------------------------
def _bench(tmp_path: Path, *overrides: str) -> None:
    args = ["split=tiny", f"out_root={tmp_path / 'bench'}", f"hydra.run.dir={tmp_path / 'outputs'}"]
    proc = run_app("experiments.benchmark", *args, "hydra.launcher.n_jobs=1", *overrides, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.integration
@pytest.mark.slow  # the tiny split also runs end to end, through submitit, in tests/experiments/test_launchers.py
def test_benchmark_tiny_split_end_to_end(tmp_path):
    quick = [f"controller.{k}={v}" for k, v in QUICK.items()] + [f"controller.cache_dir={tmp_path / 'plans'}"]
    _bench(tmp_path, "controller=hindsight", *quick)
    _bench(tmp_path, "controller=static", "static_batches=[64,512,4096]")
    _bench(tmp_path, "controller=dlb")
    root = tmp_path / "bench"
    summary = json.loads((root / "dlb" / "tiny" / "summary.json").read_text())
    assert summary["runs"] == 2 and summary["tasks"] == 2
    assert summary["limit_beaten"] == []
    assert summary["geomean_ratio_to_limit"] >= 1.0
    runs = pd.read_csv(root / "dlb" / "tiny" / "runs.csv")
    assert set(runs.columns) >= {"task", "seed", "time_to_accuracy_s", "limit_s", "best_static_s", "ratio"}
    assert runs.limit_s.notna().all() and runs.best_static_s.notna().all()
    # the diagnostic beside the ratio: the best schedule from the initial batch is never faster than the limit
    assert (runs.limit_from_initial_s >= runs.limit_s).all() and (
        runs.x_limit_from_initial <= runs.ratio
    ).all()
    assert summary["geomean_ratio_to_limit_from_initial"] <= summary["geomean_ratio_to_limit"]
    static = pd.read_csv(root / "static" / "tiny" / "runs.csv")
    assert len(static) == 2 and static.controller.str.startswith("static-").all()  # the best per task
    limit = pd.read_csv(root / "hindsight" / "tiny" / "runs.csv")
    assert (limit.ratio == 1.0).all()
    assert (limit.score_s <= static.set_index("task").loc[limit.task, "score_s"].to_numpy()).all()
    index = (root / "README.md").read_text()
    for label in ("hindsight", "static", "dlb"):
        assert f"| tiny | {label} |" in index
    assert (root / "tiny_ratios.png").stat().st_size > 1000
    assert "python -m experiments.benchmark" in (root / "dlb" / "tiny" / "summary.md").read_text()


@pytest.mark.parametrize(
    ("overrides", "label"),
    [
        (["controller=oracle_tta_endgame"], "oracle_tta_endgame"),
        (["controller=oracle_tta"], "oracle_tta"),
        (["controller=oracle"], "oracle"),
        (["controller=oracle_tta", "label=oracle-tta"], "oracle-tta"),
    ],
)
def test_the_default_label_is_the_controller_configs_name(overrides, label):
    # Two configs of one controller class (OracleController) once both wrote to results/benchmark/oracle.
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from experiments.benchmark import default_label

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("benchmark", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        try:
            assert default_label(cfg) == label
        finally:
            HydraConfig.instance().cfg = None
