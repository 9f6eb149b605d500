"""Controllers by name or bundle path: the one factory evaluation, deployment and the drop-in build from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamix_gym.controllers.base import Controller
from dynamix_gym.controllers.cannikin import CannikinController
from dynamix_gym.controllers.dlb import DLBController
from dynamix_gym.controllers.dynpipe_dp import DynPipeDPController
from dynamix_gym.controllers.hindsight import HindsightController
from dynamix_gym.controllers.omnilearn import OmniLearnController
from dynamix_gym.controllers.oracle import OracleController
from dynamix_gym.controllers.pollux import PolluxController
from dynamix_gym.controllers.random_controller import RandomController
from dynamix_gym.controllers.rex import REXController
from dynamix_gym.controllers.schedule import AccuracyScheduleController
from dynamix_gym.controllers.static import StaticController

#: Registry key -> controller class, each built with its tuned defaults by name alone (keys match
#: ``conf/controller/<key>.yaml``; the rivals the benchmark and the tests race).
CONTROLLERS: dict[str, type] = {
    "static": StaticController,
    "dlb": DLBController,
    "dynpipe_dp": DynPipeDPController,
    "omnilearn": OmniLearnController,
    "pollux": PolluxController,
    "rex": REXController,
    "cannikin": CannikinController,
    "random": RandomController,
    "oracle": OracleController,
    "hindsight": HindsightController,
}
#: Controllers whose parameters have no default (a schedule must be given): built by name with them.
PARAMETRISED: dict[str, type] = {"accuracy_schedule": AccuracyScheduleController}
#: Named presets of a registry class (``conf/controller/<name>.yaml`` configuring it otherwise):
#: name -> (registry key, parameters). tests/dynamix_gym/controllers/test_registry.py holds them to
#: the configs.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "oracle_tta": (
        "oracle",
        {"grid_points": 48, "min_gain": 0.02, "batch_penalty": 0.0, "objective": "time_to_target"},
    ),
    "oracle_tta_endgame": (
        "oracle",
        {
            "grid_points": 48,
            "min_gain": 0.02,
            "batch_penalty": 0.0,
            "objective": "time_to_target",
            "endgame_intervals": 10,
        },
    ),
}
#: The PPO bundle controller's name (its ``path`` a parameter).
BUNDLE = "ppo"


def controller_names() -> list[str]:
    """Every name :func:`make_controller` builds: one per ``conf/controller/<name>.yaml``."""
    return sorted({*CONTROLLERS, *PARAMETRISED, *PRESETS, BUNDLE})


def make_controller(name_or_bundle: str | Path, **kwargs: Any) -> Controller:
    """A new controller: registry key ``name_or_bundle`` built with ``kwargs`` (its parameters), or
    the PPO bundle (:class:`~dynamix_gym.controllers.bundle.PPOController`) at that directory path.

    Every ``conf/controller/<name>.yaml`` has its name here (:func:`controller_names`): the classes
    with tuned defaults (:data:`CONTROLLERS`), those that need parameters (:data:`PARAMETRISED`),
    presets of a class (:data:`PRESETS`, ``kwargs`` on top) and ``"ppo"``, the bundle controller
    (its ``path`` in ``kwargs``). A registry name wins over a same-named directory.

    Raises:
        ValueError: for an unknown name that is no existing path; the message lists the known ones.
    """
    key = str(name_or_bundle)
    if key in CONTROLLERS:
        return CONTROLLERS[key](**kwargs)
    if key in PARAMETRISED:
        return PARAMETRISED[key](**kwargs)
    if key in PRESETS:
        base, params = PRESETS[key]
        return CONTROLLERS[base](**{**params, **kwargs})
    if key == BUNDLE or Path(key).exists():
        from dynamix_gym.controllers.bundle import PPOController  # lazy: loads torch and SB3

        return PPOController(**kwargs) if key == BUNDLE else PPOController(Path(key), **kwargs)
    raise ValueError(f"unknown controller {key!r}: not a bundle path nor one of {controller_names()}")
