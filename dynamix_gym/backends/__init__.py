"""Backends implementing :class:`dynamix_gym.backend.Backend`."""

from dynamix_gym.backends.sim_backend import SimBackend

__all__ = ["SimBackend"]
