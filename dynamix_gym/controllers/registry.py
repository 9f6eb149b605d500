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


def make_controller(name_or_bundle: str | Path, **kwargs: Any) -> Controller:
    """A new controller: registry key ``name_or_bundle`` built with ``kwargs`` (its parameters), or
    the PPO bundle (:class:`~dynamix_gym.controllers.bundle.PPOController`) at that directory path.

    ``"ppo"`` names the bundle controller too (its ``path`` in ``kwargs``, as in
    ``conf/controller/ppo.yaml``). A registry key wins over a same-named directory.

    Raises:
        ValueError: for an unknown name that is no existing path; the message lists the known ones.
    """
    key = str(name_or_bundle)
    if key in CONTROLLERS:
        return CONTROLLERS[key](**kwargs)
    if key == "ppo" or Path(key).exists():
        from dynamix_gym.controllers.bundle import PPOController  # lazy: loads torch and SB3

        return PPOController(**kwargs) if key == "ppo" else PPOController(Path(key), **kwargs)
    raise ValueError(f"unknown controller {key!r}: not a bundle path nor one of {sorted(CONTROLLERS)}")
