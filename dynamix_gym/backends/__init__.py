"""Backends implementing :class:`sim.protocol.Backend`."""

from dynamix_gym.backends.sim_backend import SimBackend

__all__ = ["SimBackend"]
