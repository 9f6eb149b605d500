"""The evaluation harness: configs, experiments.evaluate end to end, sweeps, aggregation."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import gymnasium as gym
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from scipy import stats
from support import ROOT, run_app

from dynamix_gym.controllers.base import Controller
from dynamix_gym.evaluation import SUMMARY_COLUMNS
from dynamix_gym.reward import RewardConfig
from experiments.aggregate import best_static, console_summary, load_runs, summarise, t_interval, to_markdown
from experiments.evaluate import COLUMNS, append_csv_row, build_specs, controller_label, evaluate, make_env
from sim.cluster import CLUSTERS
from sim.faults import SCENARIOS, FaultWindow
from sim.specs_io import scenario_to_dict, workload_to_dict
from sim.workloads import WORKLOADS

CONF = ROOT / "conf"
#: The config groups of conf/evaluate.yaml.
GROUPS = ("controller", "cluster", "workload", "scenario", "reward", "backend", "experiment")
#: Groups whose options are specs converted by sim.specs_io / RewardConfig (not instantiated).
SPEC_GROUPS = ("scenario", "cluster", "workload", "reward")

TINY_CONTROLLER = '''
import numpy as np
from dynamix_gym.controllers.base import BaseController

class Fixed(BaseController):
    """Every worker at ``batch``; named like the static baseline."""
    name = "static"
    action_mode = "absolute"

    def __init__(self, batch=128):
        self.batch = batch

    def predict(self, observation, info, deterministic=True):
        return self.clip(np.full(self.spec.num_workers, self.batch)).astype(np.float32), None
'''

USER_SCENARIO = """
name: my_scenario
description: a user's scenario, outside the package
throttle: {gpu_types: [T4], rate_per_hour: 2.0, duration_s: [60.0, 120.0], speed_factor: [0.5, 0.5]}
windows:
  - {kind: throttle, start_s: 30.0, duration_s: 60.0, worker: 1, factor: 0.5}
"""


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A user's own config dir (controller/tiny.yaml, scenario/my.yaml) and the module the tiny
    controller lives in (``tiny_ctrl.py``, importable with this dir on the path)."""
    d = tmp_path_factory.mktemp("user")
    (d / "tiny_ctrl.py").write_text(TINY_CONTROLLER)
    (d / "conf" / "controller").mkdir(parents=True)
    (d / "conf" / "scenario").mkdir()
    (d / "conf" / "controller" / "tiny.yaml").write_text("_target_: tiny_ctrl.Fixed\nbatch: 128\n")
    (d / "conf" / "scenario" / "my.yaml").write_text(USER_SCENARIO)
    return d


@pytest.fixture
def on_path(user_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def compose_evaluate(user_dir: Path, *overrides: str):
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        return compose(
            "evaluate",
            overrides=[f"hydra.searchpath=[file://{user_dir}/conf]", "controller=tiny", *overrides],
        )


def options(group: str) -> list[str]:
    """The options of a group of conf/evaluate.yaml. conf/experiment/ is shared with other entry
    points: its options for this one say so in their header (`python -m experiments.evaluate`)."""
    paths = sorted((CONF / group).glob("*.yaml"))
    if group == "experiment":
        paths = [p for p in paths if "experiments.evaluate" in p.read_text()]
    return [p.stem for p in paths]


def run_module(module: str, *args: str, user_dir: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m module args`` with ``user_dir`` on the path (a user's own controller module)."""
    proc = run_app(
        module, *args, timeout=timeout, env={"PYTHONPATH": os.pathsep.join([str(user_dir), str(ROOT)])}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# --- configs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [-1, 0, float("nan"), float("inf")])
def test_a_time_budget_out_of_range_is_refused_naming_the_field(budget):
    with pytest.raises(ValueError, match=r"time_budget_s must be a number of seconds in \(0, inf\)"):
        gym.make("dynamix/HeteroCluster-v0", time_budget_s=budget)


def test_shipped_groups_cover_the_presets():
    assert options("scenario") == sorted(SCENARIOS)
    assert options("workload") == sorted(WORKLOADS)
    assert set(options("cluster")) <= set(CLUSTERS)
    assert options("reward") == ["dynamix", "time"]
    assert "sim" in options("backend")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_scenario_config_is_exactly_its_python_preset(user_dir, name):
    cfg = compose_evaluate(user_dir, f"scenario={name}")
    assert build_specs(cfg)["scenario"] == SCENARIOS[name]
    # The file spells out every field (nested ones too), not only those that differ from defaults.
    assert OmegaConf.to_container(cfg.scenario) == scenario_to_dict(SCENARIOS[name])


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workload_config_is_exactly_its_python_preset(user_dir, name):
    cfg = compose_evaluate(user_dir, f"workload={name}")
    assert build_specs(cfg)["workload"] == WORKLOADS[name]
    assert OmegaConf.to_container(cfg.workload) == workload_to_dict(WORKLOADS[name])


@pytest.mark.parametrize("name", options("cluster"))
def test_each_cluster_config_is_exactly_its_python_preset(user_dir, name):
    cfg = compose_evaluate(user_dir, f"cluster={name}")
    assert build_specs(cfg)["cluster"] == CLUSTERS[name]()


def test_default_cluster_takes_a_worker_count(user_dir):
    cfg = compose_evaluate(user_dir, "cluster.workers=16")
    assert build_specs(cfg)["cluster"] == CLUSTERS["t4v100_16"]()


@pytest.mark.parametrize(
    ("group", "name"),
    [(g, n) for g in GROUPS for n in options(g)],
)
def test_every_config_group_option_composes_and_instantiates(on_path, group, name):
    """Every option of every group: specs convert, controllers instantiate, backends build their
    env in the controller's action mode (no reset: a real backend would start its workers),
    experiments compose."""
    cfg = compose_evaluate(on_path, f"{group}={name}")
    specs = build_specs(cfg)
    if group in SPEC_GROUPS:
        assert isinstance(specs["reward"], RewardConfig)
        return
    try:
        controller = instantiate(cfg.controller)
    except InstantiationException as err:
        if isinstance(err.__cause__, FileNotFoundError):  # e.g. a PPO bundle not trained yet
            pytest.skip(f"controller {name!r} needs an artefact that is not here: {err.__cause__}")
        raise
    assert isinstance(controller, Controller)
    if group in ("backend", "experiment"):
        env = make_env(cfg, controller.action_mode, specs)
        try:
            assert env.unwrapped.action_mode == controller.action_mode
            assert env.action_space.shape == (env.unwrapped.num_workers,)
        finally:
            env.close()


def test_unknown_scenario_key_fails_naming_it(user_dir):
    cfg = compose_evaluate(user_dir, "+scenario.throttle.rate=1.0")
    with pytest.raises(ValueError, match=r"scenario.throttle: unknown key 'rate'; known keys: gpu_types"):
        build_specs(cfg)


# --- evaluate --------------------------------------------------------------------------------------
def test_evaluate_returns_tta_or_inf_and_appends_summary_rows(on_path, tmp_path):
    cfg = compose_evaluate(on_path, "scenario=throttle", "seed=2", "env.max_decisions=3")
    assert evaluate(cfg, tmp_path) == math.inf
    reached = compose_evaluate(on_path, "scenario=throttle", "seed=2", "workload.target_accuracy=0.3")
    tta = evaluate(reached, tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns) == list(COLUMNS)
    assert summary["reached_target"].tolist() == [False, True]
    assert summary["decisions"].iloc[0] == 3 and math.isnan(summary["time_to_accuracy_s"].iloc[0])
    assert 0 < tta == pytest.approx(summary["time_to_accuracy_s"].iloc[1])
    assert summary["controller"].tolist() == ["static-128"] * 2
    timeline = pd.read_csv(tmp_path / "timeline.csv")  # the last run's
    assert timeline["val_accuracy"].iloc[-1] >= 0.3 > timeline["val_accuracy"].iloc[-2]


def test_append_csv_row_refuses_a_file_with_other_columns(tmp_path):
    path = tmp_path / "summary.csv"
    append_csv_row(path, {"a": 1, "b": 2}, ["a", "b"])
    append_csv_row(path, {"a": 3, "b": 4}, ["a", "b"])
    assert path.read_text() == "a,b\n1,2\n3,4\n"
    with pytest.raises(ValueError, match="has columns"):
        append_csv_row(path, {"a": 1, "c": 2}, ["a", "c"])
    with pytest.raises(ValueError, match=r"lacks columns \['b'\]"):
        append_csv_row(path, {"a": 1}, ["a", "b"])


def test_controller_label_tells_static_batches_apart():
    class Named:
        name = "static"
        batch = 64

    assert controller_label(Named()) == "static-64"
    Named.name = "dlb"
    assert controller_label(Named()) == "dlb"


@pytest.mark.integration
def test_evaluate_cli_with_a_user_config_dir_scenario(user_dir, tmp_path):
    """A scenario that lives in the user's --config-dir, not in the package, end to end."""
    run = tmp_path / "run"
    run_module(
        "experiments.evaluate",
        "--config-dir",
        str(user_dir / "conf"),
        "controller=tiny",
        "controller.batch=64",
        "scenario=my",
        "seed=3",
        "env.max_decisions=4",
        f"hydra.run.dir={run}",
        user_dir=user_dir,
    )
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == list(SUMMARY_COLUMNS)
    row = summary.iloc[0]
    assert len(summary) == 1
    assert (row["controller"], row["scenario"], row["seed"], row["decisions"]) == (
        "static-64",
        "my_scenario",
        3,
        4,
    )
    assert not row["reached_target"] and row["backend"] == "sim" and row["workers"] == 8
    timeline = pd.read_csv(run / "timeline.csv")
    assert timeline["step"].tolist() == [0, 1, 2, 3, 4]
    assert (timeline.loc[1:, [f"w{i}_batch" for i in range(8)]] == 64).all().all()
    assert {"reward_accuracy", "w7_idle_time_s", "val_accuracy"} <= set(timeline.columns)
    # The user's scenario reached the simulator: its scheduled throttle window is logged.
    assert OmegaConf.load(run / ".hydra" / "config.yaml").scenario.windows[0] == OmegaConf.create(
        vars(FaultWindow("throttle", 30.0, 60.0, worker=1, factor=0.5))
    )


@pytest.mark.integration
@pytest.mark.slow  # subprocess sweep: make test-slow
def test_parallel_sweep_lands_in_one_dir_and_aggregates(user_dir, tmp_path):
    sweep = tmp_path / "sweep"
    run_module(
        "experiments.evaluate",
        "-m",
        "--config-dir",
        str(user_dir / "conf"),
        "controller=tiny",
        "controller.batch=64,256",
        "scenario=static_hetero,jitter",
        "seed=0,1",
        "workload.target_accuracy=0.5",
        f"hydra.sweep.dir={sweep}",
        user_dir=user_dir,
    )
    assert len(list(sweep.glob("*/summary.csv"))) == 8
    out = tmp_path / "out"
    run_module("experiments.aggregate", f"sweep_dir={sweep}", f"out={out}", user_dir=user_dir)
    table = pd.read_csv(out / "table.csv")
    assert table[["scenario", "controller"]].values.tolist() == [
        ["static_hetero", "static-64"],
        ["static_hetero", "static-256"],
        ["jitter", "static-64"],
        ["jitter", "static-256"],
    ]
    assert (table["runs"] == 2).all() and (table["reach_fraction"] == 1.0).all()
    runs = pd.read_csv(out / "summary.csv")
    assert len(runs) == 8
    one = runs[(runs["scenario"] == "jitter") & (runs["controller"] == "static-64")]
    assert table["tta_min_mean"].iloc[2] == pytest.approx(one["time_to_accuracy_s"].mean() / 60)
    md = (out / "table.md").read_text().splitlines()
    assert md[:4] == [
        "```bash",
        f"python -m experiments.evaluate -m --config-dir {user_dir / 'conf'} controller=tiny controller.batch=64,256 "
        f"scenario=static_hetero,jitter seed=0,1 workload.target_accuracy=0.5 hydra.sweep.dir={sweep}",
        f"python -m experiments.aggregate sweep_dir={sweep} out={out}",
        "```",
    ]
    for png in ("accuracy_vs_time", "batch_trajectories", "time_to_accuracy", "idle_fraction"):
        assert (out / f"{png}.png").stat().st_size > 10_000


# --- aggregation -----------------------------------------------------------------------------------
def synthetic_runs() -> pd.DataFrame:
    """Times to accuracy in minutes per controller over seeds (None: target missed)."""
    tta = {
        "static-32": [5.0, None, None],  # fastest mean, but misses the target twice
        "static-64": [10.0, 12.0, 14.0],
        "static-128": [8.0, 9.0, 10.0],
        "dlb": [7.0, 8.0, 9.0, None],
        "oracle": [6.0, 6.0, 6.0],
    }
    rows = []
    for controller, values in tta.items():
        for seed, minutes in enumerate(values):
            rows.append(
                {
                    "controller": controller,
                    "scenario": "throttle",
                    "seed": seed,
                    "time_to_accuracy_s": math.nan if minutes is None else 60.0 * minutes,
                    "final_accuracy": 0.93 if minutes is not None else 0.9,
                    "reached_target": minutes is not None,
                    "total_time_s": 60.0 * (minutes or 60.0),
                    "mean_idle_fraction": 0.1 * (seed + 1),
                    "resource_inefficiency": 0.2,
                    "batch_changes": seed,
                    "decision_time_ms": 1.0,
                    "decisions": 10,
                    "workers": 8,
                    "workload": "cifar10",
                    "backend": "sim",
                    "cluster": "t4v100x8",
                    "gpu_types": "T4 T4 T4 T4 V100 V100 V100 V100",
                    "target_accuracy": 0.93,
                    "time_budget_s": 3600.0,
                    "interval": 50,
                }
            )
    return pd.DataFrame(rows)


def test_t_interval_matches_the_student_t_formula():
    mean, lo, hi = t_interval([8.0, 9.0, 10.0])
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)  # sd 1 over 3 values
    assert (mean, lo, hi) == pytest.approx((9.0, 9.0 - half, 9.0 + half))
    assert half == pytest.approx(2.4841, abs=1e-4)
    assert t_interval([4.0, 4.0]) == (4.0, 4.0, 4.0)
    m, lo1, hi1 = t_interval([4.0])
    assert m == 4.0 and math.isnan(lo1) and math.isnan(hi1)


def test_summarise_means_intervals_and_ratios():
    table = summarise(synthetic_runs()).set_index("controller")
    assert list(table.index) == ["static-32", "static-64", "static-128", "dlb", "oracle"]
    half = stats.t.ppf(0.975, 2) / math.sqrt(3)
    dlb = table.loc["dlb"]
    assert (dlb["runs"], dlb["reached"], dlb["reach_fraction"]) == (4, 3, 0.75)
    assert dlb["tta_min_mean"] == pytest.approx(8.0)
    assert dlb["tta_min_ci95"] == pytest.approx(half)
    assert (dlb["tta_min_ci_low"], dlb["tta_min_ci_high"]) == pytest.approx((8.0 - half, 8.0 + half))
    assert dlb["idle_fraction_mean"] == pytest.approx(0.25)
    assert dlb["batch_changes_mean"] == pytest.approx(1.5)
    assert dlb["final_accuracy_mean"] == pytest.approx((3 * 0.93 + 0.9) / 4)
    # Best static: the lowest mean score over the seeds (a missed seed counts its time budget).
    assert (table["best_static"] == "static-128").all()
    assert best_static(synthetic_runs()) == "static-128"
    assert table.loc["dlb", "tta_vs_best_static"] == pytest.approx(8.0 / 9.0)
    assert table.loc["static-128", "tta_vs_best_static"] == pytest.approx(1.0)
    assert table.loc["static-64", "tta_vs_oracle"] == pytest.approx(12.0 / 6.0)
    assert table.loc["oracle", "tta_min_ci95"] == 0.0
    assert math.isnan(table.loc["static-32", "tta_min_ci95"])  # one reaching seed: no interval

    md = to_markdown(summarise(synthetic_runs()), ["python -m x"], "T")
    assert md.startswith("```bash\npython -m x\n```\n\n# T")
    assert "| throttle | dlb | 8.0 ± 2.5 | 3/4 † | 0.9225 | 25.0% | 0.200 | 1.5 | 1.000 | 0.89 | 1.33 |" in md
    assert "| throttle | static-128 (best static) | 9.0 ± 2.5 | 3/3 |" in md


def test_the_console_shows_the_table_and_the_plots_paths_only(tmp_path):
    """What `make demo` and `experiments.aggregate` print: the table from its title on, then where
    the files are; not the commands block, not the wide data frame behind the table."""
    md = to_markdown(summarise(synthetic_runs()), ["python -m x"], "T")
    plots = [tmp_path / "accuracy_vs_time.png", tmp_path / "batch_trajectories.png"]
    text = console_summary(md, tmp_path, plots)
    assert text.startswith("# T\n") and "```" not in text and "python -m x" not in text
    assert "| throttle | static-128 (best static) | 9.0 ± 2.5 | 3/3 |" in text
    assert not any(col in text for col in ("tta_min_ci95", "reach_fraction", "tta_vs_oracle"))
    assert text.endswith(f"Plots:\n  {plots[0]}\n  {plots[1]}")
    assert f"Table: {tmp_path / 'table.md'}" in text


def test_load_runs_counts_a_repeated_run_once(tmp_path):
    runs = synthetic_runs()
    for i in range(3):
        (tmp_path / f"job{i}").mkdir()
        runs.iloc[i::3].to_csv(tmp_path / f"job{i}" / "summary.csv", index=False)
    runs.iloc[:2].to_csv(tmp_path / "job0" / "again.csv", index=False)  # not a summary: ignored
    (tmp_path / "rerun").mkdir()
    runs.iloc[:2].to_csv(tmp_path / "rerun" / "summary.csv", index=False)
    loaded = load_runs(tmp_path)
    assert len(loaded) == len(runs)
    assert set(loaded["run_dir"]) == {str(tmp_path / d) for d in ("job0", "job1", "job2", "rerun")}
    with pytest.raises(FileNotFoundError, match=r"no summary\.csv"):
        load_runs(tmp_path / "job0" / "nothing")


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_ddp_backend_is_one_more_yaml(user_dir, tmp_path):
    """The env-factory contract holds for dynamix/RealDDP-v0: a backend yaml in a user config dir
    (two gloo ranks on CPU) runs through the same entry point."""
    (user_dir / "conf" / "backend").mkdir(exist_ok=True)
    (user_dir / "conf" / "backend" / "real_cpu.yaml").write_text(
        "_target_: gymnasium.make\n_partial_: true\nid: dynamix/RealDDP-v0\nworkers: 2\ntime_budget_s: 120.0\n"
    )
    run_module(
        "experiments.evaluate",
        "--config-dir",
        str(user_dir / "conf"),
        "backend=real_cpu",
        "controller=tiny",
        "controller.batch=32",
        "env.max_decisions=2",
        "env.interval=5",
        f"hydra.run.dir={tmp_path}",
        user_dir=user_dir,
        timeout=600,
    )
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert (row["backend"], row["workers"], row["decisions"], row["controller"]) == (
        "real",
        2,
        2,
        "static-32",
    )


@pytest.mark.integration
@pytest.mark.slow
def test_every_experiment_runs_as_a_sweep(tmp_path):
    """lightning-hydra-template's test_sweeps: `-m experiment=glob(*)` with a tiny budget (less the
    experiments of other entry points)."""
    others = sorted({p.stem for p in (CONF / "experiment").glob("*.yaml")} - set(options("experiment")))
    proc = run_app(
        "experiments.evaluate",
        "-m",
        f"experiment=glob(*,exclude=[{','.join(others)}])" if others else "experiment=glob(*)",
        "env.max_decisions=2",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(tmp_path.glob("*/summary.csv"))) == len(options("experiment"))
