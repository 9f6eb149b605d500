"""Batch-size controllers: rule-based baselines, the oracle, and loaded PPO bundles."""

from dynamix_gym.controllers.base import BaseController, Controller

__all__ = ["BaseController", "Controller"]
