"""A candidate of the online learner: a pure function of its inputs (the parent bundle, the
transitions or replicas, the settings, a generator), run on the learner's thread or in a spawned
child (:func:`~dynamix_gym.service.child.call_in_child`). :func:`ppo_update` is SB3's own PPO
update on the logged transitions, :func:`replica_update` DAgger on simulated replicas of the jobs
served; :func:`build_candidate` validates the parent where needed, makes the candidate and
validates it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dynamix_gym.controllers.bundle import PolicyBundle, load_bundle
from dynamix_gym.learning.config import ExpertPretrainConfig
from dynamix_gym.service.transitions import Transition, gae

if TYPE_CHECKING:
    from dynamix_gym.service.learner import LearnerConfig


def ppo_update(
    parent: PolicyBundle, data: list[Transition], cfg: LearnerConfig, rng: np.random.Generator
) -> tuple[Any, dict[str, float]]:
    """A copy of ``parent``'s model after one PPO update on ``data`` (sb3-contrib's MaskablePPO
    update, with each decision's logged legal steps, for a maskable bundle)."""
    from stable_baselines3.common.buffers import RolloutBuffer
    from stable_baselines3.common.logger import configure

    maskable = parent.meta.algorithm == "maskable_ppo"
    if maskable:
        from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer as buffer_cls
    else:
        buffer_cls = RolloutBuffer
    model = copy_model(parent)  # the serving weights
    obs, actions, values, logp, adv, returns = gae(data, float(model.gamma), float(model.gae_lambda))
    n = len(actions)
    buf = buffer_cls(
        n, model.observation_space, model.action_space, device="cpu", gamma=model.gamma, n_envs=1
    )
    if maskable:
        width = int(buf.mask_dims)  # a centralised bundle's flat (N * A) mask
        masks = np.ones((n, width), dtype=np.float32)
        for i, t in enumerate(data):
            if t.mask is not None:
                masks[i] = np.asarray(t.mask, dtype=np.float32).reshape(width)
        buf.action_masks[:] = masks[:, None, :]
    buf.observations[:] = obs[:, None, :]
    buf.actions[:] = actions.reshape(n, 1, 1)
    buf.values[:] = values[:, None]
    buf.log_probs[:] = logp[:, None]
    buf.advantages[:] = adv[:, None]
    buf.returns[:] = returns[:, None]
    buf.pos, buf.full = n, True
    lr = float(cfg.learning_rate)
    model.rollout_buffer = buf
    model.learning_rate = lr
    model.lr_schedule = lambda _progress: lr
    model.clip_range = lambda _progress: float(cfg.clip_range)
    model.n_epochs, model.batch_size, model.ent_coef = (
        int(cfg.n_epochs),
        int(cfg.batch_size),
        float(cfg.ent_coef),
    )
    model.set_logger(configure(None, [""]))
    model.set_random_seed(int(rng.integers(2**31)))
    model.train()
    values_out = model.logger.name_to_value
    stats = {k.split("/")[-1]: float(v) for k, v in values_out.items() if k.startswith("train/")}
    stats["samples"] = n
    return model, stats


def copy_model(parent: PolicyBundle):
    """A fresh copy of ``parent``'s model with the serving weights."""
    if parent.meta.algorithm == "maskable_ppo":
        from sb3_contrib import MaskablePPO as algo
    else:
        from stable_baselines3 import PPO as algo
    model = algo.load(parent.path / "model.zip", device="cpu")
    model.policy.load_state_dict(parent.model.policy.state_dict())
    return model


def replica_update(
    parent: PolicyBundle, replicas: list[dict[str, Any]], cfg: LearnerConfig, rng: np.random.Generator
) -> tuple[Any, dict[str, float]]:
    """A copy of ``parent``'s model after DAgger on simulated replicas of the jobs served.

    Each replica is the simulator run on a served job's GPU types, workload and interval, with
    the fault families, intensities and speed spread of the bundle's own training worlds (its
    ``config.domain``); the candidate acts, the bundle's teacher (its ``expert_pretrain``'s
    oracle, else the time-to-target oracle) labels every state it visits, and the policy is
    cloned on those labels (cross-entropy, every episode weighted alike, with the value head's
    regression) for ``replica_epochs`` at ``replica_learning_rate``: DYNAMIX's online
    fine-tuning done in the service's simulator, on the clusters and jobs it actually serves.
    """
    from dynamix_gym.learning.imitation import collect_expert_data, pretrain

    if not replicas:
        raise RuntimeError("the replica learner has no registered job to replicate yet")
    if parent.meta.algorithm not in ("ppo", "maskable_ppo") or parent.meta.obs_form != "per_worker":
        raise ValueError("the replica learner fine-tunes per-worker PPO bundles only")
    conf = dict(parent.meta.config or {})
    teacher = ExpertPretrainConfig.from_any(conf.get("expert_pretrain"))
    expert = teacher.expert if teacher is not None else "oracle"
    expert_kwargs = dict(
        (teacher.expert_kwargs if teacher is not None else None)
        or {"objective": "time_to_target", "batch_penalty": 0.0}
    )
    base_domain = {
        k: v
        for k, v in dict(conf.get("domain") or {}).items()
        if k not in ("gpu_types", "profile", "workers")
    }
    env_kwargs = {
        **dict(conf.get("env") or {}),
        "split": parent.meta.split,
        "split_tolerance": parent.meta.split_tolerance,
    }
    model = copy_model(parent)
    obs_fn = parent.obs_norm if parent.obs_norm is not None else (lambda x: x)
    per = max(1, -(-int(cfg.replica_episodes) // len(replicas)))
    data = None
    for r in replicas:
        domain = {**base_domain, "cluster": r["cluster"], "workloads": [r["workload"]]}
        part = collect_expert_data(
            domain,
            {**env_kwargs, "interval": r["interval"]},
            [r["cluster"].num_workers],
            episodes=per,
            gamma=float(model.gamma),
            seed=int(rng.integers(2**31)),
            expert=expert,
            expert_kwargs=expert_kwargs,
            policy=model,
            obs_fn=obs_fn,
            action_mode=parent.meta.action_mode,
        )
        data = part if data is None else data + part
    scale = float(np.sqrt(np.var(data.returns) + 1e-8))
    stats = pretrain(
        model,
        data,
        obs_fn,
        scale,
        epochs=int(cfg.replica_epochs),
        learning_rate=float(cfg.replica_learning_rate),
        seed=int(rng.integers(2**31)),
        per_episode=True,
    )
    stats.update(replicas=len(replicas), episodes=per * len(replicas), expert_mean_tta_s=data.mean_tta_s)
    return model, stats


@dataclass
class CandidateJob:
    """Everything an update needs, picklable for :func:`~dynamix_gym.service.child.call_in_child`.

    ``parent`` is the serving bundle on the learner's thread; a child gets ``parent_path`` and the
    serving weights (``parent_state``) and loads the bundle itself. ``rng`` is the learner's own
    generator (a child advances a copy and sends it back), so both workers draw the same seeds.
    """

    config: LearnerConfig
    rng: np.random.Generator
    data: list[Transition]
    replicas: list[dict[str, Any]]
    validate: Callable[[PolicyBundle], dict[str, float]] | None  # None: no validation (skip_validation)
    parent_scores: dict[str, float] | None  # the parent's cached validation, or None to compute it
    parent: PolicyBundle | None = None
    parent_path: Path | None = None
    parent_state: dict[str, np.ndarray] | None = None


@dataclass
class CandidateResult:
    rng: np.random.Generator
    stats: dict[str, float]
    scores: dict[str, float]  # the candidate's validation ({} without)
    parent_scores: dict[str, float] | None  # computed here (None: the job had them, or no validation)
    model: Any = None  # on the learner's thread
    state: dict[str, np.ndarray] | None = None  # from a child: the candidate's policy weights


def weights_to_numpy(policy) -> dict[str, np.ndarray]:
    """A policy's weights as numpy copies: torch's own pickling of tensors between processes passes
    shared-memory handles, which die with the process that sent them."""
    return {k: v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}


def load_numpy_weights(policy, weights: dict[str, np.ndarray]) -> None:
    import torch

    policy.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})


def build_candidate(job: CandidateJob) -> CandidateResult:
    """Validate the parent if needed, make the candidate (:func:`ppo_update` or
    :func:`replica_update`), validate it: the part of an update that does not touch the service."""
    parent = job.parent
    if parent is None:
        parent = load_bundle(job.parent_path)
        load_numpy_weights(parent.model.policy, job.parent_state)
    parent_scores = None
    if job.validate is not None and job.parent_scores is None:
        parent_scores = dict(job.validate(parent))
    if job.config.mode == "replica":
        model, stats = replica_update(parent, job.replicas, job.config, job.rng)
    else:
        model, stats = ppo_update(parent, job.data, job.config, job.rng)
    candidate = PolicyBundle(parent.path, parent.meta, model, parent.obs_norm)
    scores = dict(job.validate(candidate)) if job.validate is not None else {}
    return CandidateResult(job.rng, stats, scores, parent_scores, model=model)


def build_candidate_in_child(job: CandidateJob) -> CandidateResult:
    """:func:`build_candidate` as a child's call: the weights come back, not the SB3 model."""
    result = build_candidate(job)
    result.state = weights_to_numpy(result.model.policy)
    result.model = None
    return result
