"""The online learner's experience: one :class:`Transition` per worker and interval, and GAE over
each (job, worker) trajectory."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np


class Transition(NamedTuple):
    """One worker's decision of one interval of one job, completed by the interval's reward."""

    session: str  # "<job>/<session>": the trajectory's job first, so trajectories sort by job
    worker: int  # the worker's row in the decision
    obs: np.ndarray  # the worker's (per-worker) observation row
    action: int  # the sampled action index
    value: float  # the policy's value estimate
    log_prob: float  # the sampled action's log-probability
    reward: float  # the interval's reward (from the job's next report)
    done: bool  # the job ended with this interval
    next_value: float  # the value estimate of the next decision's row (0 at the end)
    version: int  # the policy version that decided
    mask: np.ndarray | None = None  # the legal steps of a MaskablePPO bundle's decision (None: all)


def as_transitions(items: Iterable[Sequence]) -> list[Transition]:
    """Transitions from tuples in :class:`Transition`'s field order (replays of a log, tests);
    a tuple without the mask counts every step as legal."""
    out = []
    for t in items:
        if isinstance(t, Transition):
            out.append(t)
        elif not 10 <= len(t) <= 11:
            raise ValueError(f"a transition has 10 or 11 fields {Transition._fields}, got {len(t)}")
        else:
            out.append(Transition(*t))
    return out


def gae(data: Sequence[Transition], gamma: float, lam: float):
    """Advantages and returns per (job, worker) trajectory, in the buffer's order."""
    n = len(data)
    obs = np.stack([t.obs for t in data]).astype(np.float32)
    actions = np.array([t.action for t in data], dtype=np.int64)
    values = np.array([t.value for t in data], dtype=np.float64)
    logp = np.array([t.log_prob for t in data], dtype=np.float64)
    rewards = np.array([t.reward for t in data], dtype=np.float64)
    done = np.array([t.done for t in data], dtype=bool)
    next_v = np.array([t.next_value for t in data], dtype=np.float64)
    adv = np.zeros(n)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(data):
        groups[(t.session, t.worker)].append(i)
    # The critic learnt VecNormalize's scaled returns, a scale the bundle does not keep: put the
    # rewards on the critic's scale by matching the spread of discounted returns to the values'.
    mc = np.zeros(n)
    for idx in groups.values():
        acc = 0.0
        for j in reversed(idx):
            acc = rewards[j] + gamma * (0.0 if done[j] else acc)
            mc[j] = acc
    spread, v_spread = float(mc.std()), float(values.std())
    rewards = rewards * (v_spread / spread if spread > 1e-9 and v_spread > 1e-9 else 1.0)
    for idx in groups.values():
        last = 0.0
        for j in reversed(idx):
            nonterminal = 0.0 if done[j] else 1.0
            delta = rewards[j] + gamma * next_v[j] * nonterminal - values[j]
            last = delta + gamma * lam * nonterminal * last
            adv[j] = last
    return obs, actions, values, logp, adv, adv + values
