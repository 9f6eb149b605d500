"""Warm-starting PPO from an expert controller (behaviour cloning), before RL fine-tuning.

The expert (by default the simulator's oracle) emits target batches; :func:`expert_steps` turns
them into the env's discrete actions (delta or scale: the legal step of the action set that lands
closest to the target, holding within ``tolerance``). Rollouts of that delta-following expert on randomised
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
    return expert_steps("delta", current, target, action_set, tolerance)


def expert_steps(
    action_mode: str,
    current: np.ndarray,
    target: np.ndarray,
    action_set: np.ndarray,
    tolerance: float,
    legal: np.ndarray | None = None,
) -> np.ndarray:
    """Index into ``action_set`` per worker for a discrete ``action_mode``: the step whose result
    (``delta``: b + d; ``scale``: round(b * f)) lands closest to ``target`` (in samples for
    ``delta``, in log2 for ``scale``, so that x2 and x1/2 weigh alike) among the ``legal`` steps
    (the env's mask; all when None); the no-change step whenever the target is within
    ``tolerance`` (samples for ``delta``, a relative distance for ``scale``)."""
    cur = np.asarray(current, dtype=np.float64)
    tgt = np.asarray(target, dtype=np.float64)
    steps = np.asarray(action_set, dtype=np.float64)
    if action_mode == "delta":
        landing = cur[:, None] + steps[None, :]
        dist = np.abs(landing - tgt[:, None])
        hold = np.abs(tgt - cur) <= tolerance
        neutral = int(np.flatnonzero(steps == 0)[0])
    elif action_mode == "scale":
        landing = np.maximum(np.rint(cur[:, None] * steps[None, :]), 1.0)
        dist = np.abs(np.log2(landing) - np.log2(np.maximum(tgt, 1.0))[:, None])
        hold = np.abs(tgt / np.maximum(cur, 1.0) - 1.0) <= tolerance
        neutral = int(np.argmin(np.abs(steps - 1.0)))
    else:
        raise ValueError(f"expert steps exist in the discrete modes delta and scale, not {action_mode!r}")
    if legal is not None:
        dist = np.where(legal, dist, np.inf)
    return np.where(hold, neutral, dist.argmin(axis=1))


def discounted_returns(rewards, gamma: float) -> np.ndarray:
    """The discounted return from every step of one episode's ``rewards``. A truncated episode is
    not bootstrapped: its last returns are slightly low."""
    g = 0.0
    out = np.empty(len(rewards))
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def _mean_of_finite(*values: float) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _is_maskable(model) -> bool:
    return type(model).__name__ == "MaskablePPO"


@dataclass
class ExpertData:
    obs: np.ndarray  # (S, Fw + Fg) per-worker observation rows
    actions: np.ndarray  # (S,) action indices
    returns: np.ndarray  # (S,) discounted return of the cluster reward from that step
    episodes: int
    mean_tta_s: float  # of the episodes that reached the target, under whoever acted
    # (S,) the number of decisions of each row's episode: weighting rows by its inverse makes
    # every episode count alike (a 3-decision NCF run beside a 300-decision CIFAR-100 one)
    episode_decisions: np.ndarray | None = None

    def __add__(self, other: ExpertData) -> ExpertData:
        lengths = None
        if self.episode_decisions is not None and other.episode_decisions is not None:
            lengths = np.concatenate([self.episode_decisions, other.episode_decisions])
        return ExpertData(
            np.concatenate([self.obs, other.obs]),
            np.concatenate([self.actions, other.actions]),
            np.concatenate([self.returns, other.returns]),
            self.episodes + other.episodes,
            _mean_of_finite(self.mean_tta_s, other.mean_tta_s),
            lengths,
        )

    def weights(self, per_episode: bool) -> np.ndarray:
        """(S,) sample weights with mean 1: all ones, or (``per_episode``) each episode's rows
        sharing one episode's worth."""
        if not per_episode:
            return np.ones(len(self.actions), dtype=np.float32)
        if self.episode_decisions is None:
            raise ValueError("per-episode weights need episode_decisions (data collected by this version)")
        w = 1.0 / np.asarray(self.episode_decisions, dtype=np.float64)
        return (w / w.mean()).astype(np.float32)

    def save(self, path) -> None:
        """An .npz of every field (written to a temporary name, then renamed: never half-written)."""
        from pathlib import Path

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            obs=self.obs,
            actions=self.actions,
            returns=self.returns,
            episodes=self.episodes,
            mean_tta_s=self.mean_tta_s,
            episode_decisions=self.episode_decisions if self.episode_decisions is not None else np.zeros(0),
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path) -> ExpertData:
        z = np.load(path)
        lengths = z["episode_decisions"]
        return cls(
            z["obs"],
            z["actions"],
            z["returns"],
            int(z["episodes"]),
            float(z["mean_tta_s"]),
            lengths if lengths.size else None,
        )


def collect_expert_data(
    domain: dict,
    env_kwargs: dict,
    sizes: list[int],
    episodes: int,
    gamma: float,
    seed: int,
    expert: str = "oracle",
    expert_kwargs: dict | None = None,
    tolerance: float | None = None,
    policy=None,
    obs_fn=None,
    action_mode: str = "delta",
) -> ExpertData:
    """Roll out on randomised clusters of each size in ``sizes``, labelling every state with the
    delta-following expert's action.

    Without ``policy`` the expert acts (behaviour cloning data). With ``policy`` (an SB3 model;
    ``obs_fn`` normalises its input) the policy acts and the expert only labels: DAgger's data,
    the states the learner itself visits (Ross et al., AISTATS 2011). ``expert_kwargs`` are the
    expert's parameters (e.g. ``{"objective": "time_to_target", "batch_penalty": 0.0}`` for the
    time-to-target oracle).
    """
    obs_rows, acts, rets, lens, ttas = [], [], [], [], []
    controller = make_controller(expert, **dict(expert_kwargs or {}))
    rng = np.random.default_rng(seed)
    for ep in range(episodes):
        n = sizes[ep % len(sizes)]
        env = RandomizedClusterEnv(
            domain=DomainRandomization(**{**domain, "workers": n}),
            **{**env_kwargs, "action_mode": action_mode},
        )
        _, info = env.reset(seed=int(rng.integers(2**31 - 1)))
        controller.reset(env.backend.spec, rng)
        if tolerance is not None:
            tol = tolerance
        elif action_mode == "scale":  # half the smallest relative step
            tol = float(np.min(np.abs(env.action_set[env.action_set != 1.0] - 1.0))) / 2
        else:
            tol = float(np.min(np.abs(env.action_set[env.action_set != 0]))) / 2
        ep_obs, ep_act, ep_rew = [], [], []
        done = False
        while not done:
            target, _ = controller.predict(None, info)
            legal = env.action_mask_matrix()
            a = expert_steps(
                action_mode, env.batches, np.asarray(target, dtype=np.float64), env.action_set, tol, legal
            )
            rows = env.per_worker_observations()
            ep_obs.append(rows)
            ep_act.append(a)
            if policy is not None:
                x = obs_fn(rows) if obs_fn else rows
                masked = {"action_masks": legal} if _is_maskable(policy) else {}
                acted, _ = policy.predict(x, deterministic=True, **masked)
                a = np.asarray(acted, dtype=np.int64)
            _, r, term, trunc, info = env.step(a)
            ep_rew.append(r)
            done = term or trunc
        if term:
            ttas.append(info["time_to_accuracy_s"])
        returns = discounted_returns(ep_rew, gamma)
        for o, a, ret in zip(ep_obs, ep_act, returns, strict=True):
            obs_rows.append(o)
            acts.append(a)
            rets.append(np.full(len(a), ret))
            lens.append(np.full(len(a), len(ep_act)))
        env.close()
    return ExpertData(
        np.concatenate(obs_rows).astype(np.float32),
        np.concatenate(acts).astype(np.int64),
        np.concatenate(rets).astype(np.float32),
        episodes,
        float(np.mean(ttas)) if ttas else float("nan"),
        np.concatenate(lens).astype(np.int64),
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
    per_episode: bool = False,
    sample_weights: np.ndarray | None = None,
) -> dict[str, float]:
    """Behaviour cloning of ``model.policy`` (cross-entropy) plus value regression on the returns.

    ``obs_fn`` normalises observations as the training env will (VecNormalize); value targets are
    returns divided by ``return_scale`` (VecNormalize's reward scale). ``per_episode`` weights
    every episode alike (:meth:`ExpertData.weights`) instead of every decision. ``sample_weights``
    (S,) multiply those weights (renormalised to mean 1), e.g. to weigh a rare action up.
    """
    w = data.weights(per_episode)
    if sample_weights is not None:
        sw = np.asarray(sample_weights, dtype=np.float64)
        if sw.shape != w.shape or not np.all(np.isfinite(sw)) or np.any(sw < 0) or not sw.sum() > 0:
            raise ValueError(f"sample_weights must be {w.shape[0]} finite weights >= 0, not all 0")
        w = w * sw
        w = (w / w.mean()).astype(np.float32)
    policy = model.policy
    device = policy.device
    obs = torch.as_tensor(obs_fn(data.obs), device=device)
    actions = torch.as_tensor(data.actions, device=device)
    targets = torch.as_tensor(data.returns / return_scale, device=device)
    weights = torch.as_tensor(w, device=device)
    opt = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    gen = torch.Generator().manual_seed(seed)
    n = len(actions)
    policy.set_training_mode(True)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch_size):
            idx = perm[i : i + batch_size]
            values, log_prob, _ = policy.evaluate_actions(obs[idx], actions[idx])
            w = weights[idx]
            loss = -(w * log_prob).mean() + 0.5 * (w * (values.flatten() - targets[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            opt.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        dist = policy.get_distribution(obs)
        hits = dist.get_actions(deterministic=True) == actions
        if hits.ndim > 1:  # MultiDiscrete: an action agrees when every entry does
            hits = hits.all(dim=1)
        hits = hits.float()
        agree = float(hits.mean())
        agree_weighted = float((weights * hits).mean())
        values = policy.predict_values(obs).flatten()
        value_r2 = 1.0 - float(((values - targets) ** 2).mean() / targets.var().clamp_min(1e-12))
    log.info(
        "behaviour cloning: %.1f%% action agreement, value R^2 %.3f on %d samples", 100 * agree, value_r2, n
    )
    out = {"action_agreement": agree, "value_r2": value_r2, "samples": n}
    if per_episode:
        out["action_agreement_per_episode"] = agree_weighted
    return out
