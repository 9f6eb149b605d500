"""Warm-starting PPO from an expert controller (behaviour cloning), before RL fine-tuning.

The expert (by default the simulator's oracle) emits target batches; :func:`expert_deltas` turns
them into the env's delta actions (the step from the action set that lands closest to the
target, holding within ``tolerance``). Rollouts of that delta-following expert on randomised
clusters give per-worker (observation, action) pairs and the discounted returns of the training
reward. :func:`pretrain` fits the policy head by maximum likelihood and the value head to the
returns, so PPO starts from a competent policy whose critic already knows what it is worth.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv

log = logging.getLogger(__name__)


def expert_deltas(
    current: np.ndarray, target: np.ndarray, action_set: np.ndarray, tolerance: float
) -> np.ndarray:
    """Index into ``action_set`` per worker: the delta whose result is closest to ``target``;
    the zero delta whenever the target is within ``tolerance`` samples."""
    landing = current[:, None] + action_set[None, :]
    best = np.abs(landing - target[:, None]).argmin(axis=1)
    zero = int(np.flatnonzero(action_set == 0)[0])
    return np.where(np.abs(target - current) <= tolerance, zero, best)


@dataclass
class ExpertData:
    obs: np.ndarray  # (S, Fw + Fg) per-worker observation rows
    actions: np.ndarray  # (S,) action indices
    returns: np.ndarray  # (S,) discounted return of the cluster reward from that step
    episodes: int
    mean_tta_s: float  # of the episodes that reached the target, under whoever acted

    def __add__(self, other: ExpertData) -> ExpertData:
        return ExpertData(
            np.concatenate([self.obs, other.obs]),
            np.concatenate([self.actions, other.actions]),
            np.concatenate([self.returns, other.returns]),
            self.episodes + other.episodes,
            float(np.nanmean([self.mean_tta_s, other.mean_tta_s])),
        )


def collect_expert_data(
    domain: dict,
    env_kwargs: dict,
    sizes: list[int],
    episodes: int,
    gamma: float,
    seed: int,
    expert: str = "oracle",
    tolerance: float | None = None,
    policy=None,
    obs_fn=None,
) -> ExpertData:
    """Roll out on randomised clusters of each size in ``sizes``, labelling every state with the
    delta-following expert's action.

    Without ``policy`` the expert acts (behaviour cloning data). With ``policy`` (an SB3 model;
    ``obs_fn`` normalises its input) the policy acts and the expert only labels: DAgger's data,
    the states the learner itself visits (Ross et al., AISTATS 2011).
    """
    obs_rows, acts, rets, ttas = [], [], [], []
    controller = make_controller(expert)
    rng = np.random.default_rng(seed)
    for ep in range(episodes):
        n = sizes[ep % len(sizes)]
        env = RandomizedClusterEnv(
            domain=DomainRandomization(**{**domain, "workers": n}), **{**env_kwargs, "action_mode": "delta"}
        )
        _, info = env.reset(seed=int(rng.integers(2**31 - 1)))
        controller.reset(env.backend.spec, rng)
        tol = (
            float(np.min(np.abs(env.action_set[env.action_set != 0]))) / 2 if tolerance is None else tolerance
        )
        ep_obs, ep_act, ep_rew = [], [], []
        done = False
        while not done:
            target, _ = controller.predict(None, info)
            a = expert_deltas(env.batches, np.asarray(target, dtype=np.float64), env.action_set, tol)
            rows = env.per_worker_observations()
            ep_obs.append(rows)
            ep_act.append(a)
            if policy is not None:
                acted, _ = policy.predict(obs_fn(rows) if obs_fn else rows, deterministic=True)
                a = np.asarray(acted, dtype=np.int64)
            _, r, term, trunc, info = env.step(a)
            ep_rew.append(r)
            done = term or trunc
        if term:
            ttas.append(info["time_to_accuracy_s"])
        g = 0.0  # a truncated episode is not bootstrapped: its last returns are slightly low
        returns = np.empty(len(ep_rew))
        for t in range(len(ep_rew) - 1, -1, -1):
            g = ep_rew[t] + gamma * g
            returns[t] = g
        for o, a, ret in zip(ep_obs, ep_act, returns, strict=True):
            obs_rows.append(o)
            acts.append(a)
            rets.append(np.full(len(a), ret))
        env.close()
    return ExpertData(
        np.concatenate(obs_rows).astype(np.float32),
        np.concatenate(acts).astype(np.int64),
        np.concatenate(rets).astype(np.float32),
        episodes,
        float(np.mean(ttas)) if ttas else float("nan"),
    )


def pretrain(
    model,
    data: ExpertData,
    obs_fn,
    return_scale: float,
    epochs: int = 20,
    batch_size: int = 1024,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Behaviour cloning of ``model.policy`` (cross-entropy) plus value regression on the returns.

    ``obs_fn`` normalises observations as the training env will (VecNormalize); value targets are
    returns divided by ``return_scale`` (VecNormalize's reward scale).
    """
    policy = model.policy
    device = policy.device
    obs = torch.as_tensor(obs_fn(data.obs), device=device)
    actions = torch.as_tensor(data.actions, device=device)
    targets = torch.as_tensor(data.returns / return_scale, device=device)
    opt = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    gen = torch.Generator().manual_seed(seed)
    n = len(actions)
    policy.set_training_mode(True)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch_size):
            idx = perm[i : i + batch_size]
            values, log_prob, _ = policy.evaluate_actions(obs[idx], actions[idx])
            loss = -log_prob.mean() + 0.5 * torch.nn.functional.mse_loss(values.flatten(), targets[idx])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            opt.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        dist = policy.get_distribution(obs)
        agree = float((dist.get_actions(deterministic=True) == actions).float().mean())
        values = policy.predict_values(obs).flatten()
        value_r2 = 1.0 - float(((values - targets) ** 2).mean() / targets.var().clamp_min(1e-12))
    log.info(
        "behaviour cloning: %.1f%% action agreement, value R^2 %.3f on %d samples", 100 * agree, value_r2, n
    )
    return {"action_agreement": agree, "value_r2": value_r2, "samples": n}
