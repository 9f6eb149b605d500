"""A centralised critic for the per-worker shared actor (MAPPO-style, ``critic=centralised``).

The per-worker form trains one actor shared by every worker, each a sample with its own row (its
own features plus the cluster-wide ones) and the cluster's reward. Its critic sees the same row,
so it cannot tell how the *other* workers stand, though every worker's return depends on them:
the credit-assignment weak spot of independent learners sharing one reward. MAPPO (Yu et al.,
NeurIPS 2022 datasets and benchmarks) keeps the decentralised actor and gives the critic the
global state. Here the state is size-free, so that one critic serves 2 and 16 workers alike: the
mean, minimum and maximum over the cluster's workers of each per-worker (``self.*``) feature,
appended to every worker's row (:func:`with_critic_state`).

The actor never reads the state: its features extractor (:class:`ActorInputs`) multiplies the
state's inputs by zero, so its first layer's weights on them never take a gradient, and what it
decides depends on the worker's row alone, as on a real backend. The critic's extractor passes
everything. :func:`from_local_bundle` turns a bundle trained with the local critic into this
form: the actor's and the critic's weights copied, zero weights on the state's inputs (so it
starts as the bundle's own critic and PPO teaches it to use the state), the observation
statistics of the state taken from those of the worker features it aggregates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, FlattenExtractor

#: What a bundle's critic read in training: its worker's row (``local``) or the row plus the
#: cluster's state (``centralised``).
CRITICS = ("local", "centralised")
#: Statistics of the per-worker features over the cluster that form the critic's state.
STATE_STATISTICS = ("mean", "min", "max")


def critic_state_dim(worker_dim: int) -> int:
    return len(STATE_STATISTICS) * int(worker_dim)


def with_critic_state(rows: np.ndarray, worker_dim: int) -> np.ndarray:
    """(N, D) per-worker rows of one cluster -> (N, D + 3 Fw): each row followed by the cluster's
    mean, min and max of the first ``worker_dim`` (per-worker) features, the same for every
    worker whatever the cluster's size."""
    rows = np.asarray(rows, dtype=np.float32)
    own = rows[:, :worker_dim]
    state = np.concatenate([own.mean(axis=0), own.min(axis=0), own.max(axis=0)])
    return np.concatenate([rows, np.broadcast_to(state, (len(rows), state.size))], axis=1)


class ActorInputs(BaseFeaturesExtractor):
    """The observation flattened, with every input past ``actor_dim`` (the critic's state) zeroed."""

    def __init__(self, observation_space: spaces.Box, actor_dim: int) -> None:
        dim = int(np.prod(observation_space.shape))
        if not 0 < actor_dim <= dim:
            raise ValueError(f"actor_dim must lie in [1, {dim}], got {actor_dim}")
        super().__init__(observation_space, dim)
        mask = torch.zeros(dim)
        mask[:actor_dim] = 1.0
        self.register_buffer("mask", mask)

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return torch.flatten(observations, start_dim=1) * self.mask


def _central(base: type[ActorCriticPolicy], name: str) -> type[ActorCriticPolicy]:
    class Central(base):  # type: ignore[misc, valid-type]
        """``base`` with the actor on the worker's row (:class:`ActorInputs`) and the critic on the
        row plus the cluster's state; ``actor_dim`` is the row's length."""

        def __init__(self, observation_space, action_space, lr_schedule, actor_dim: int, **kwargs: Any):
            kwargs.update(
                features_extractor_class=ActorInputs,
                features_extractor_kwargs={"actor_dim": int(actor_dim)},
                share_features_extractor=False,
            )
            self.actor_dim = int(actor_dim)
            super().__init__(observation_space, action_space, lr_schedule, **kwargs)
            # The critic reads everything (the extractors hold no parameters: the optimiser built
            # above is unchanged).
            self.vf_features_extractor = FlattenExtractor(observation_space)

        def _get_constructor_parameters(self) -> dict[str, Any]:
            data = super()._get_constructor_parameters()
            data.update(actor_dim=self.actor_dim)
            for key in ("features_extractor_class", "features_extractor_kwargs", "share_features_extractor"):
                data.pop(key, None)
            return data

    Central.__name__ = Central.__qualname__ = name  # importable by name: model.zip pickles a reference
    return Central


#: The centralised-critic policies of PPO and of sb3-contrib's MaskablePPO.
CentralCriticPolicy = _central(ActorCriticPolicy, "CentralCriticPolicy")
MaskableCentralCriticPolicy = _central(MaskableActorCriticPolicy, "MaskableCentralCriticPolicy")


def central_policy_class(algorithm: str) -> type[ActorCriticPolicy]:
    return MaskableCentralCriticPolicy if algorithm == "maskable_ppo" else CentralCriticPolicy


def from_local_bundle(model, base_policy, worker_dim: int) -> None:
    """Load a local-critic policy's weights (``base_policy``) into ``model``'s centralised-critic
    policy: every tensor copied; the first layer of the actor's and the critic's networks gets
    zero weights on the state's inputs, so the critic starts as the local one."""
    own = base_policy.state_dict()
    target = model.policy.state_dict()
    for key, value in own.items():
        if key not in target:
            raise ValueError(f"the bundle's policy has {key!r}, the centralised-critic policy has not")
        new = target[key]
        if new.shape == value.shape:
            target[key] = value.clone()
        elif new.ndim == 2 and new.shape[0] == value.shape[0] and new.shape[1] > value.shape[1]:
            padded = torch.zeros_like(new)
            padded[:, : value.shape[1]] = value
            target[key] = padded
        else:
            raise ValueError(f"{key}: the bundle's shape {tuple(value.shape)} cannot seed {tuple(new.shape)}")
    model.policy.load_state_dict(target)


def extend_obs_stats(mean: np.ndarray, var: np.ndarray, worker_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Observation statistics of the rows extended to the state (each statistic of a feature
    normalised as the feature itself)."""
    k = len(STATE_STATISTICS)
    return (
        np.concatenate([mean, np.tile(mean[:worker_dim], k)]),
        np.concatenate([var, np.tile(var[:worker_dim], k)]),
    )
