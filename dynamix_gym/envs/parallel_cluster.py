"""ParallelClusterEnv: the per-worker decision problem as a PettingZoo ParallelEnv (agents = workers)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from dynamix_gym.envs.hetero_cluster import DISCRETE_ACTION_MODES, HeteroClusterEnv

log = logging.getLogger(__name__)

#: reset options passed on to the cluster env; others are logged and ignored (PettingZoo's API
#: test resets with ``options={"options": 1}``)
RESET_OPTIONS = ("initial_batches",)


class ParallelClusterEnv(ParallelEnv):
    """
    ## Description
    :class:`HeteroClusterEnv` seen by the multi-agent RL ecosystem: each worker of the cluster is
    an agent (``"worker_0"`` ... ``"worker_{N-1}"``) that sets its own local batch, all at once,
    every interval, from its own features plus the cluster-wide ones. It is the per-worker problem
    of :class:`~dynamix_gym.envs.vec_env.PerWorkerVecEnv` (SB3, parameter sharing) in PettingZoo's
    ``ParallelEnv`` interface, for MAPPO/IPPO-style trainers (and SuperSuit's conversions). The
    backend, observation encoder, action handling and reward are the wrapped
    :class:`HeteroClusterEnv`'s own: nothing is recomputed here.

    ## Action Space
    Per agent ``Discrete(len(action_set))``: the worker's batch delta (``action_mode="delta"``,
    default, DYNAMIX's {-100, -25, 0, +25, +100}) or factor (``"scale"``, x{1/2, 4/5, 1, 5/4, 2}).
    ``infos[agent]["action_mask"]`` (bool, one entry per step) marks the steps that keep the
    worker within its [min, max] batch; an unmasked step outside is clipped and listed in
    ``infos[agent]["clipped"]``, as in the wrapped env.

    ## Observation Space
    Per agent ``Box(-1, 1, (Fw + Fg,), float32)``: the worker's own features, then the global
    features of the chosen observation schema (``obs_schema=1``: 19 + 13; ``obs_schema=2``,
    scale-free: 14 + 15; ``obs_schema=3``: 14 + 17; tables in :mod:`dynamix_gym.obs.v1`,
    :mod:`dynamix_gym.obs.v2` and :mod:`dynamix_gym.obs.v3`).
    :meth:`state` is the centralised observation (every worker's features, then the global ones;
    ``state_space``) for centralised critics.

    ## Rewards
    Every agent receives the cluster's reward (``reward="dynamix"`` or ``"time"``, see
    :mod:`dynamix_gym.reward`): the workers cooperate on one job.

    ## Starting State
    As :class:`HeteroClusterEnv`: a fresh run at every worker's initial batch and one warm-up
    interval. ``reset(options={"initial_batches": [...]})`` starts at other batches.

    ## Episode End
    All agents terminate together when the validation quality reaches the target and truncate
    together at the time or decision budget; ``agents`` is then empty until the next ``reset``. A
    worker lost to a fault stays an agent (its ``alive`` feature reads 0): the cluster keeps its
    slot.

    ## Arguments
    ``ParallelClusterEnv(**kwargs)`` (or :func:`parallel_env`): every keyword of
    :class:`HeteroClusterEnv` (``workers``, ``cluster``, ``workload``, ``scenario``, ``reward``,
    ``interval``, ``action_mode`` in ``delta``/``scale``, ``action_set``, ``obs_schema``,
    ``max_decisions``, ``backend`` ...).

    ## Version History
    * v0: initial version.
    """

    metadata = {"name": "dynamix_parallel_cluster_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, **kwargs: Any) -> None:
        mode = kwargs.get("action_mode", "delta")
        if mode not in DISCRETE_ACTION_MODES:
            raise ValueError(
                f"ParallelClusterEnv supports action_mode in {list(DISCRETE_ACTION_MODES)}, got {mode!r}"
            )
        self.cluster_env = HeteroClusterEnv(**kwargs)
        n = self.cluster_env.num_workers
        self.possible_agents = [f"worker_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        dim = self.cluster_env.obs_schema.per_worker_dim
        k = int(self.cluster_env.action_set.size)
        self._obs_spaces = {a: spaces.Box(-1.0, 1.0, (dim,), np.float32) for a in self.possible_agents}
        self._act_spaces = {a: spaces.Discrete(k) for a in self.possible_agents}
        self.state_space = self.cluster_env.observation_space
        self.render_mode = None

    # --- PettingZoo API -----------------------------------------------------------------------------
    def observation_space(self, agent: str) -> spaces.Box:
        """The agent's space: the same object on every call (so seeding it sticks)."""
        return self._obs_spaces[self._check_agent(agent)]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._act_spaces[self._check_agent(agent)]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        opts = dict(options or {})
        unknown = sorted(set(opts) - set(RESET_OPTIONS))
        if unknown:
            log.warning(
                "ParallelClusterEnv.reset ignores unknown options %s; known: %s", unknown, RESET_OPTIONS
            )
        passed = {k: v for k, v in opts.items() if k in RESET_OPTIONS}
        _, info = self.cluster_env.reset(seed=seed, options=passed or None)
        self.agents = list(self.possible_agents)
        return self._observations(), self._infos(info)

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise RuntimeError("ParallelClusterEnv.step() needs live agents: call reset() first")
        missing = [a for a in self.agents if a not in actions]
        extra = sorted(set(actions) - set(self.agents))
        if missing or extra:
            raise ValueError(
                f"actions must name every live agent once: missing {missing}, unknown {extra} "
                f"(agents: {self.agents[0]} ... {self.agents[-1]})"
            )
        joint = np.empty(len(self.agents), dtype=np.int64)
        for i, agent in enumerate(self.agents):
            a = actions[agent]
            if not self._act_spaces[agent].contains(a):
                raise ValueError(f"actions[{agent!r}] = {a!r} is outside {self._act_spaces[agent]}")
            joint[i] = int(a)
        _, reward, terminated, truncated, info = self.cluster_env.step(joint)
        agents = self.agents
        observations, infos = self._observations(), self._infos(info)
        rewards = dict.fromkeys(agents, float(reward))
        terminations = dict.fromkeys(agents, bool(terminated))
        truncations = dict.fromkeys(agents, bool(truncated))
        if terminated or truncated:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        """The centralised observation (``state_space``): every worker's features, then the global ones."""
        return self.cluster_env._obs()

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.cluster_env.close()

    # --- helpers ------------------------------------------------------------------------------------
    def _check_agent(self, agent: str) -> str:
        if agent not in self._index:
            raise ValueError(f"unknown agent {agent!r}; agents are {self.possible_agents}")
        return agent

    def _observations(self) -> dict[str, np.ndarray]:
        rows = self.cluster_env.per_worker_observations()
        return {a: rows[i] for i, a in enumerate(self.possible_agents)}

    def _infos(self, info: dict[str, Any]) -> dict[str, dict[str, Any]]:
        masks = self.cluster_env.action_mask_matrix()
        clipped: dict[int, list] = {}
        for c in info["clipped"]:
            clipped.setdefault(c["worker"], []).append(c)
        return {
            a: {**info, "worker": i, "action_mask": masks[i], "clipped": clipped.get(i, [])}
            for i, a in enumerate(self.possible_agents)
        }


def parallel_env(**kwargs: Any) -> ParallelClusterEnv:
    """PettingZoo's constructor convention: ``parallel_env(workers=8, obs_schema=2, ...)``."""
    return ParallelClusterEnv(**kwargs)
