"""The committed hindsight plans are the benchmark's limit: a change to the simulator's inputs that
leaves the model unchanged (a new parameter at its default) must leave their cache keys unchanged,
or every plan is searched again (an hour) and the committed scores lose their limit."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from support import CONF, ROOT

from dynamix_gym.benchmark import split_tasks, task_specs

PLANS = ROOT / "results" / "benchmark" / "hindsight" / "plans"


def _keys(split: str, n: int) -> list[tuple[str, int, str]]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("benchmark", overrides=["controller=hindsight", f"split={split}"])
    tasks, seeds = split_tasks(cfg.benchmark, split)
    ctrl = instantiate(cfg.controller)
    out = []
    for name in sorted(tasks)[:n]:
        task = tasks[name]
        env = instantiate(cfg.backend)(
            **task_specs(task, cfg.reward), action_mode=ctrl.action_mode,
            interval=int(task.get("interval", 50)), **cfg.env,
        )  # fmt: skip
        try:
            out.append((name, seeds[0], ctrl.cache_key(env, seeds[0])))
        finally:
            env.close()
    return out


@pytest.mark.parametrize("split", ["test", "train"])
def test_committed_hindsight_plans_are_found_by_their_keys(split):
    if not PLANS.is_dir():
        pytest.skip("no committed plans")
    missing = [
        (name, seed, key) for name, seed, key in _keys(split, 3) if not (PLANS / f"{key}.json").exists()
    ]
    assert not missing, f"no committed plan under {PLANS} for {missing}: the key inputs changed"
