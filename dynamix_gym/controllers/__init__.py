"""Batch-size controllers: rule-based baselines, the oracle, and loaded PPO bundles.

Every baseline reads only the observation, ``info["report"]`` and ``info["local_batches"]`` (the
oracle alone reads ``report.truth``) and emits absolute local batches. Build one by name with
:func:`make_controller` (keys in :data:`CONTROLLERS`, configs in ``conf/controller/``).
"""

from dynamix_gym.controllers.base import BaseController, Controller
from dynamix_gym.controllers.cannikin import CannikinController
from dynamix_gym.controllers.dlb import DLBController
from dynamix_gym.controllers.omnilearn import OmniLearnController
from dynamix_gym.controllers.oracle import OracleController
from dynamix_gym.controllers.pollux import PolluxController
from dynamix_gym.controllers.random_controller import RandomController
from dynamix_gym.controllers.registry import CONTROLLERS, make_controller
from dynamix_gym.controllers.rex import REXController
from dynamix_gym.controllers.static import STATIC_GRID, StaticController

__all__ = [
    "CONTROLLERS",
    "STATIC_GRID",
    "BaseController",
    "CannikinController",
    "Controller",
    "DLBController",
    "OmniLearnController",
    "OracleController",
    "PolluxController",
    "REXController",
    "RandomController",
    "StaticController",
    "make_controller",
]
