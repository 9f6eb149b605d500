"""Grids past one machine: every launcher conf/README.md names composes with every entry point, and
a real two-run grid goes through submitit's local executor (the code path a SLURM node runs)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import ROOT, run_python

CONF = ROOT / "conf"
#: Every primary config: one per ``python -m experiments.<app>``.
APPS = sorted(p.stem for p in CONF.glob("*.yaml"))
#: Launchers the configs must compose with whatever the docs say (the issue's list).
REQUIRED = {"joblib", "submitit_local", "submitit_slurm"}
#: Configs that pick a launcher or its settings themselves, composed beside their app's defaults.
EXTRA = {"train": (["experiment=train_seeds"], ["hparams_search=reward_optuna"])}
TARGETS = {
    "local": "JoblibLauncher",
    "joblib": "JoblibLauncher",
    "basic": "BasicLauncher",
    "submitit_local": "LocalLauncher",
    "submitit_slurm": "SlurmLauncher",
}


def documented_launchers() -> list[str]:
    names = set()
    for doc in (CONF / "README.md", ROOT / "README.md"):
        names |= set(re.findall(r"hydra/launcher=(\w+)", doc.read_text()))
    return sorted(names)


def test_the_docs_name_every_required_launcher():
    assert REQUIRED <= set(documented_launchers())
    assert set(documented_launchers()) <= set(TARGETS), "a documented launcher this file does not check"


@pytest.mark.parametrize("launcher", documented_launchers())
@pytest.mark.parametrize("app", APPS)
def test_every_app_composes_with_every_launcher(app, launcher):
    for extra in ([], *EXTRA.get(app, ())):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose(app, overrides=[f"hydra/launcher={launcher}", *extra], return_hydra_config=True)
        assert cfg.hydra.launcher._target_.endswith(TARGETS[launcher]), (app, extra)
        if launcher.startswith("submitit"):
            assert "n_jobs" not in cfg.hydra.launcher, (app, extra)


def test_local_keeps_the_projects_joblib_settings():
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("evaluate", return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == -1  # one run per core; no machine's count in git


@pytest.mark.parametrize("app", ["evaluate", "benchmark"])
def test_the_local_example_sets_this_machines_parallel_runs(app):
    """conf/local/example.yaml is what conf/local/default.yaml (gitignored) looks like: picked by
    name here, it sets the launcher's parallel runs."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(app, overrides=["local=example"], return_hydra_config=True)
    assert cfg.hydra.launcher.n_jobs == 2


@pytest.mark.parametrize("app", APPS)
def test_every_app_names_its_run_dirs(app):
    """One hydra block (conf/hydra/default.yaml) keyed by each app's task_name; `_self_` after the
    groups and `hydra: default`, before the presets that override the app's keys."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(app, return_hydra_config=True)
    assert cfg.hydra.job.chdir is False
    defaults = yaml.safe_load((CONF / f"{app}.yaml").read_text()).get("defaults")
    if "task_name" not in cfg:
        pytest.skip(f"{app} keeps its own hydra block")
    assert cfg.task_name == app
    run_dir = OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"]
    assert "${task_name}" in run_dir or app == "demo", run_dir  # the demo's: under its out folder
    names = [next(iter(d)) if isinstance(d, dict) else d for d in defaults]
    assert names.index("hydra") == names.index("_self_") - 1, names
    for later in ("experiment", "hparams_search", "optional local"):
        if later in names:
            assert names.index(later) > names.index("_self_"), names


def presets() -> list[tuple[str, str]]:
    """Every preset in conf/experiment/ with the app its name gives it (conf/README.md)."""
    names = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    return [(name, "train" if name.startswith("train_") else "evaluate") for name in names]


@pytest.mark.parametrize(("preset", "app"), presets())
def test_every_preset_composes_with_its_app(preset, app):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(app, overrides=[f"experiment={preset}"], return_hydra_config=True)
    assert cfg.hydra.runtime.choices.experiment == preset


@pytest.mark.integration
@pytest.mark.parametrize("launcher", sorted(REQUIRED))
def test_cfg_hydra_prints_the_chosen_launcher(launcher):
    """The issue's command line itself: ``--cfg hydra`` prints the config it would launch with."""
    proc = run_python(
        ["-m", "experiments.evaluate", f"hydra/launcher={launcher}", "--cfg", "hydra"], timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{TARGETS[launcher]}\n" in proc.stdout


def submitit_grid(module: str, sweep: Path, *overrides: str, timeout: float = 300) -> list[Path]:
    """A two-run grid of ``module`` through ``hydra/launcher=submitit_local``; the run dirs."""
    proc = run_python(
        ["-m", module, "-m", "hydra/launcher=submitit_local", *overrides, f"hydra.sweep.dir={sweep}"],
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each run was a submitit job: its own pickled result beside its log
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2, proc.stderr[-3000:]
    return sorted(p.parent for p in sweep.glob("*/.hydra"))


@pytest.mark.integration
def test_evaluate_grid_through_submitit_local(tmp_path):
    runs = submitit_grid("experiments.evaluate", tmp_path / "sweep", "seed=0,1", "env.max_decisions=2")
    assert len(runs) == 2
    rows = pd.concat([pd.read_csv(run / "summary.csv") for run in runs], ignore_index=True)
    assert sorted(rows["seed"]) == [0, 1]
    assert (rows["decisions"] == 2).all()
    assert (rows["backend"] == "sim").all()


@pytest.mark.integration
@pytest.mark.slow  # subprocess sweep: make test-slow
def test_benchmark_grid_through_submitit_local(tmp_path):
    """experiments.benchmark forwards the launcher to the multirun it starts: the tiny split's two
    tasks run as two submitit jobs, then the plain run scores them."""
    root = tmp_path / "bench"
    proc = run_python(
        [
            "-m",
            "experiments.benchmark",
            "split=tiny",
            "controller=dlb",
            f"out_root={root}",
            "hydra/launcher=submitit_local",
            f"hydra.run.dir={tmp_path / 'outputs'}",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = root / "dlb" / "tiny" / "runs"
    assert len(list((runs / ".submitit").glob("*/*_result.pkl"))) == 2
    rows = pd.read_csv(root / "dlb" / "tiny" / "runs.csv")
    assert sorted(rows["task"]) == ["tiny_cifar10_t4v100x4_throttle", "tiny_ncf_t4v100x4_static"]
    assert (rows["seed"] == 0).all()
    assert "hydra/launcher=submitit_local" in (root / "dlb" / "tiny" / "summary.md").read_text()
