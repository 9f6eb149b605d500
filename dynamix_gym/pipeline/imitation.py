"""Warm-starting the pipeline policy from a teacher (behaviour cloning, then DAgger), before PPO.

Two teachers, both started where the policy starts, from DynPipe's plan
(:func:`~dynamix_gym.pipeline.controllers.dynpipe_start`):

- ``greedy_gain`` (:class:`~dynamix_gym.pipeline.controllers.GreedyGainController`, the default):
  moves the boundary of the largest measured move gain when it exceeds a threshold. Its decision
  is a function of the v1 observation (the move gains are its last features), so a student can
  learn it exactly.
- ``truth`` (:class:`TruthTeacher`): the truth-reading re-planner (a candidate of the hindsight
  limit) walking toward PipeDream's DP on the stage groups' true slowdowns whenever that cuts the
  slowest stage's cost by more than ``min_gain``. It reads the simulator's truth and plans several
  moves ahead, which the student cannot see: on the train split its students re-partitioned far
  more than it did (``results/pipeline/README.md``).

:func:`collect_teacher_data` rolls the teacher (or, with ``policy``, the student, the teacher only
labelling: DAgger, Ross et al. 2011) out on the pipeline split's generated worlds and returns
:class:`~dynamix_gym.learning.imitation.ExpertData` (observations, the MultiDiscrete actions, the
discounted returns of the ``time`` reward), which :func:`~dynamix_gym.learning.imitation.pretrain`
fits (the policy by maximum likelihood, the value head to the returns).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from dynamix_gym.learning.imitation import ExpertData, discounted_returns
from dynamix_gym.pipeline.controllers import (
    GreedyGainController,
    PipelineController,
    TruthReplanController,
    dynpipe_start,
)

log = logging.getLogger(__name__)


class TruthTeacher(TruthReplanController):
    """The truth-reading re-planner from the policy's own start (DynPipe's plan): the teacher."""

    name = "truth_teacher"

    def start_options(self, env, seed: int) -> dict[str, Any]:
        return dynpipe_start(env, seed)


def make_teacher(name: str, threshold: float = 0.1, min_gain: float = 0.4) -> PipelineController:
    """``greedy_gain`` (at ``threshold``) or ``truth`` (at ``min_gain``): the module docstring."""
    if name == "greedy_gain":
        return GreedyGainController(threshold)
    if name == "truth":
        return TruthTeacher(min_gain=min_gain)
    raise ValueError(f"imitation.teacher must be 'greedy_gain' or 'truth', got {name!r}")


def collect_teacher_data(
    env,
    seeds: list[int],
    gamma: float,
    teacher: PipelineController | None = None,
    policy=None,
) -> ExpertData:
    """One episode of ``env`` (a ``PipelineClusterEnv`` over generated worlds) per seed, every state
    labelled with ``teacher``'s action (default :class:`GreedyGainController`). Without ``policy``
    the teacher acts (cloning data); with ``policy`` (a MaskablePPO model) the policy acts, masked,
    and the teacher only labels (DAgger).
    """
    if not seeds:
        raise ValueError("collect_teacher_data needs at least one seed")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    teacher = teacher if teacher is not None else GreedyGainController()
    obs_rows, acts, rets, lens, ttas = [], [], [], [], []
    for seed in seeds:
        obs, info = env.reset(seed=int(seed), options=teacher.start_options(env, int(seed)))
        teacher.reset(env)
        ep_obs, ep_act, ep_rew = [], [], []
        terminated = truncated = False
        while not (terminated or truncated):
            label, _ = teacher.predict(obs, info)
            ep_obs.append(obs)
            ep_act.append(np.asarray(label, dtype=np.int64))
            act = label
            if policy is not None:
                act, _ = policy.predict(obs, deterministic=True, action_masks=env.action_masks())
            obs, reward, terminated, truncated, info = env.step(act)
            ep_rew.append(float(reward))
        if terminated:
            ttas.append(info["report"].wall_time_s)
        obs_rows += ep_obs
        acts += ep_act
        rets.append(discounted_returns(ep_rew, gamma))
        lens.append(np.full(len(ep_rew), len(ep_rew)))
    return ExpertData(
        np.stack(obs_rows).astype(np.float32),
        np.stack(acts).astype(np.int64),
        np.concatenate(rets).astype(np.float32),
        len(seeds),
        float(np.mean(ttas)) if ttas else math.nan,
        np.concatenate(lens).astype(np.int64),
    )
