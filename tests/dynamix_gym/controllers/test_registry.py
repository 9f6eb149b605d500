"""The controller registry names every conf/controller/<name>.yaml, builds each one as its config
instantiates it, and the base class declares the hooks every caller calls."""

from __future__ import annotations

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from support import ROOT

from dynamix_gym.controllers.base import BaseController, env_options, hooks, start_options
from dynamix_gym.controllers.registry import PRESETS, controller_names, make_controller

CONF = ROOT / "conf"


def _composed(name: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("evaluate", overrides=[f"controller={name}"])
    return OmegaConf.to_container(cfg.controller, resolve=True)


def test_the_registry_names_every_controller_config():
    assert controller_names() == sorted(p.stem for p in (CONF / "controller").glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_is_its_config(name):
    params = _composed(name)
    target = params.pop("_target_")
    built = make_controller(name)
    assert f"{type(built).__module__}.{type(built).__name__}" == target
    assert PRESETS[name][1] == params
    assert vars(built) == vars(instantiate(_composed(name)))


def test_accuracy_schedule_builds_by_name_with_its_phases():
    params = _composed("accuracy_schedule")
    built = make_controller("accuracy_schedule", phases=params["phases"])
    assert built.phases == instantiate(_composed("accuracy_schedule")).phases


def test_the_hooks_default_to_nothing_and_a_bare_controller_gets_the_defaults():
    class Bare:  # a Controller by shape alone
        name, action_mode, uses_truth = "bare", "absolute", False

        def env_options(self):  # not a declared hook of a bare controller: never called
            raise AssertionError("called")

    base = BaseController()
    assert base.env_options() == {} and base.initial_batches(None) is None and base.search_log is None
    assert env_options(Bare()) == {} and start_options(Bare(), None) is None
    assert isinstance(hooks(Bare()), BaseController)
    static = make_controller("static", batch=64, start_at_batch=True)

    class Spec:
        num_workers = 2
        min_batch = np.array([1, 1])
        max_batch = np.array([512, 512])

    assert start_options(static, Spec())["initial_batches"].tolist() == [64, 64]
