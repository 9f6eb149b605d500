"""Controllers by name: the registry the evaluation tools and tests build baselines from."""

from __future__ import annotations

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
from dynamix_gym.controllers.static import StaticController

#: Registry key -> controller class (keys match ``conf/controller/<key>.yaml``).
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


def make_controller(name: str, **kwargs: Any) -> Controller:
    """A new controller of registry key ``name``, built with ``kwargs`` (its parameters).

    Raises:
        ValueError: for an unknown ``name``; the message lists the known ones.
    """
    try:
        cls = CONTROLLERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown controller {name!r}; known controllers: {sorted(CONTROLLERS)}") from None
    return cls(**kwargs)
