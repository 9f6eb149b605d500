"""dynamix-bench-v1, the suite: its tasks and seeds per split, the split rules, a task's simulator specs.

The suite is declared in ``conf/benchmark/v1.yaml`` (:data:`SUITE_PATH`): tasks (workload x
cluster x scenario, each the name of a config in that group under ``conf/``, and optionally the
decision interval) in splits ``train`` (training, tuning, imitation, validation) and ``test``
(scoring alone), with the seeds of each split. Every app that reads the suite reads it here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dynamix_gym.configs import plain as _plain
from dynamix_gym.reward import RewardConfig
from sim.specs_io import cluster_from_dict, scenario_from_dict, workload_from_dict

#: The repository's config groups: a task names a workload, a cluster and a scenario among them.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: dynamix-bench-v1's declaration.
SUITE_PATH = CONF_DIR / "benchmark" / "v1.yaml"
SUITE_NAME = "dynamix-bench-v1"
#: What a task names, and the config group each name is looked up in.
TASK_GROUPS = {"workload": workload_from_dict, "cluster": cluster_from_dict, "scenario": scenario_from_dict}
TASK_KEYS = (*TASK_GROUPS, "interval")
#: The decision interval (iterations) of a task that names none.
DEFAULT_INTERVAL = 50
#: The splits whose tasks and seeds may be used to train, tune or validate; ``test`` is for scoring.
TRAIN_SPLIT, TEST_SPLIT = "train", "test"


def _conf_dir() -> Path:
    if not CONF_DIR.is_dir():
        raise FileNotFoundError(
            f"the benchmark's tasks name configs under {CONF_DIR}, which is not there: the suite is read "
            "from a checkout of the repository (pip install -e .)"
        )
    return CONF_DIR


def load_suite(path: str | Path | None = None) -> dict[str, Any]:
    """The suite declared at ``path`` (default :data:`SUITE_PATH`; a relative path is the
    repository's, as ``conf/benchmark/v1.yaml``) as plain containers."""
    root = _conf_dir().parent
    file = SUITE_PATH if path is None else Path(path) if Path(path).is_absolute() else root / path
    return _plain(OmegaConf.load(file))


def split_tasks(bench: DictConfig | dict, split: str) -> tuple[dict[str, dict[str, Any]], list[int]]:
    """The tasks (name -> spec) and seeds of ``split``, checked."""
    bench = _plain(bench)
    splits = bench.get("splits", {})
    if split not in splits:
        raise ValueError(f"benchmark {bench.get('name')!r} has no split {split!r}; splits: {sorted(splits)}")
    entry = splits[split]
    tasks, seeds = dict(entry.get("tasks") or {}), list(entry.get("seeds") or [])
    if not tasks or not seeds:
        raise ValueError(f"benchmark split {split!r} needs at least one task and one seed")
    conf = _conf_dir()
    for name, task in tasks.items():
        unknown = sorted(set(task) - set(TASK_KEYS))
        missing = [k for k in TASK_GROUPS if k not in task]
        if unknown or missing:
            raise ValueError(
                f"benchmark task {name!r}: unknown keys {unknown} / missing keys {missing}; a task has "
                f"{list(TASK_GROUPS)} (config names) and optionally interval"
            )
        for group in TASK_GROUPS:
            path = conf / group / f"{task[group]}.yaml"
            if not path.exists():
                raise ValueError(
                    f"benchmark task {name!r}: {group} {task[group]!r} has no config conf/{group}/{task[group]}.yaml"
                )
    return tasks, [int(s) for s in seeds]


def check_suite(bench: DictConfig | dict) -> None:
    """The split rules: seeds never shared between splits, and every test task differs from every
    train task in at least one of workload, cluster or scenario."""
    bench = _plain(bench)
    train, train_seeds = split_tasks(bench, TRAIN_SPLIT)
    test, test_seeds = split_tasks(bench, TEST_SPLIT)
    shared = sorted(set(train_seeds) & set(test_seeds))
    if shared:
        raise ValueError(f"benchmark seeds {shared} are in both the train and the test split")
    triples = {(t["workload"], t["cluster"], t["scenario"]) for t in train.values()}
    for name, t in test.items():
        if (t["workload"], t["cluster"], t["scenario"]) in triples:
            raise ValueError(f"test task {name!r} repeats a train task's workload, cluster and scenario")


def task_interval(task: dict[str, Any]) -> int:
    """A task's decision interval in iterations (:data:`DEFAULT_INTERVAL` unless it names one)."""
    return int(task.get("interval", DEFAULT_INTERVAL))


def task_specs(task: dict[str, Any], reward: Any) -> dict[str, Any]:
    """The simulator's specs of a task (each name loaded from its config group) and ``reward``."""
    conf = _conf_dir()
    specs = {
        group: convert(_plain(OmegaConf.load(conf / group / f"{task[group]}.yaml")))
        for group, convert in TASK_GROUPS.items()
    }
    specs["reward"] = RewardConfig.from_any(_plain(reward))
    return specs


def held_out_tasks(
    names: list[str] | None, split: str = TRAIN_SPLIT, bench: DictConfig | dict | None = None
) -> dict[str, dict[str, Any]]:
    """The named tasks of ``split`` (all of them with ``names`` None) for validation: a split other
    than the train split is refused (the test split is for scoring alone), as is an unknown name."""
    if split != TRAIN_SPLIT:
        raise ValueError(
            f"validation tasks come from the benchmark's {TRAIN_SPLIT} split, not {split!r} "
            f"(the {TEST_SPLIT} split is for scoring only)"
        )
    tasks, _ = split_tasks(load_suite() if bench is None else bench, split)
    chosen = list(tasks) if names is None else list(names)
    unknown = sorted(set(chosen) - set(tasks))
    if unknown:
        raise ValueError(f"{unknown} are not tasks of the {split} split; choose from {sorted(tasks)}")
    return {n: tasks[n] for n in chosen}


def validation_tasks(names: list[str], split: str = TRAIN_SPLIT) -> list[dict[str, Any]]:
    """The named tasks of the train split as pretraining's validation tasks (``TrainConfig.eval_tasks``:
    each ``{"name", "interval", "cluster", "workload", "scenario"}`` with the simulator's specs)."""
    out = []
    for name, task in held_out_tasks(names, split).items():
        specs = task_specs(task, "time")
        out.append({"name": name, "interval": task_interval(task),
                    **{k: specs[k] for k in ("cluster", "workload", "scenario")}})  # fmt: skip
    return out
