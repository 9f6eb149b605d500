"""PPO pretraining over simulated clusters: the training environments, checkpoints, the four ways a
run starts (resumed, fine-tuned, fine-tuned into a centralised critic, fresh with an optional warm
start) and :func:`train`, which runs PPO from there and writes the bundles.

The settings are :class:`~dynamix_gym.learning.config.TrainConfig`; the callbacks live in
:mod:`dynamix_gym.learning.callbacks`, the warm start in :mod:`dynamix_gym.learning.warm_start`.
The Hydra entry point ``python -m experiments.train`` is a thin shell around :func:`train`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecMonitor, VecNormalize

from dynamix_gym.benchmark.validation import DOMAIN_SCENARIO, evaluate_policy_tta
from dynamix_gym.controllers.bundle import BundleMeta, ObsNorm, PolicyBundle, load_bundle, save_bundle
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv
from dynamix_gym.envs.vec_env import PerWorkerVecEnv
from dynamix_gym.learning.callbacks import (
    BehaviourCloningTerm,
    CriticWarmup,
    RewardTermsCallback,
    TTAEvalCallback,
)
from dynamix_gym.learning.central_critic import central_policy_class, extend_obs_stats, from_local_bundle
from dynamix_gym.learning.config import (
    ALGORITHMS,
    FINETUNE_PPO_KEYS,
    ExpertPretrainConfig,
    TrainConfig,
    check_train_config,
)
from dynamix_gym.learning.wallclock import WallClockLimit
from dynamix_gym.learning.warm_start import (
    EXPERT_CACHE_VERSION,
    expert_cache_path,
    train_env_kwargs,
    warm_start,
)

__all__ = [
    "ALGORITHMS",
    "DOMAIN_SCENARIO",
    "EXPERT_CACHE_VERSION",
    "FINETUNE_PPO_KEYS",
    "ExpertPretrainConfig",
    "TrainConfig",
    "algorithm_class",
    "check_train_config",
    "evaluate_policy_tta",
    "expert_cache_path",
    "latest_checkpoint",
    "make_train_venv",
    "train",
    "train_env_kwargs",
]

log = logging.getLogger(__name__)

#: Kept under its old name (tests and notebooks read it).
_expert_cache_path = expert_cache_path


def algorithm_class(name: str):
    """The SB3 class of ``name`` (:data:`ALGORITHMS`)."""
    if name == "ppo":
        return PPO
    if name == "maskable_ppo":
        from sb3_contrib import MaskablePPO

        return MaskablePPO
    raise ValueError(f"algorithm must be one of {list(ALGORITHMS)}, got {name!r}")


class FrozenRunningMeanStd(RunningMeanStd):
    """Observation statistics that no longer move (``freeze_obs_norm``); pickles with the
    VecNormalize of a checkpoint, so a resumed run stays frozen."""

    def update(self, arr: np.ndarray) -> None:
        return None


def freeze_obs_stats(venv: VecEnv) -> None:
    """Replace ``venv``'s observation statistics (a VecNormalize's) by a frozen copy."""
    if isinstance(venv, VecNormalize) and venv.norm_obs:
        frozen = FrozenRunningMeanStd(shape=venv.obs_rms.mean.shape)
        frozen.mean, frozen.var = venv.obs_rms.mean.copy(), venv.obs_rms.var.copy()
        frozen.count = venv.obs_rms.count
        venv.obs_rms = frozen


# --- environments -----------------------------------------------------------------------------------


def _cluster_env_fn(domain: dict, env_kwargs: dict, workers: int) -> Callable[[], HeteroClusterEnv]:
    def make() -> HeteroClusterEnv:
        return RandomizedClusterEnv(
            domain=DomainRandomization(**{**domain, "workers": workers}), **env_kwargs
        )

    return make


def make_train_venv(cfg: TrainConfig) -> VecEnv:
    """Randomised simulated clusters, per-worker (shared policy) or centralised, monitored; with
    ``vec_env=batched`` every cluster in one batched simulator (per-worker form)."""
    env_kwargs = {**train_env_kwargs(cfg), "action_mode": cfg.action_mode}
    if cfg.vec_env == "batched":
        from dynamix_gym.envs.batched_per_worker import BatchedPerWorkerVecEnv

        sizes = [int(n) for n in cfg.cluster_sizes] * cfg.batched_copies
        venv = BatchedPerWorkerVecEnv(
            domain=DomainRandomization(**{**cfg.domain, "workers": sizes[0]}),
            num_clusters=len(sizes),
            domain_workers=sizes,
            critic_state=cfg.critic == "centralised",
            **env_kwargs,
        )
    elif cfg.obs_form == "per_worker":
        fns = [_cluster_env_fn(cfg.domain, env_kwargs, n) for n in cfg.cluster_sizes]
        venv: VecEnv = PerWorkerVecEnv(
            fns,
            sizes=list(cfg.cluster_sizes),
            subprocess=cfg.subprocess,
            critic_state=cfg.critic == "centralised",
        )
    elif cfg.obs_form == "centralised":
        fns = [
            _cluster_env_fn(cfg.domain, env_kwargs, cfg.centralised_workers)
            for _ in range(cfg.centralised_envs)
        ]
        venv = SubprocVecEnv(fns, start_method="spawn") if cfg.subprocess else DummyVecEnv(fns)
    else:
        raise ValueError(f"obs_form must be 'per_worker' or 'centralised', got {cfg.obs_form!r}")
    venv.seed(cfg.seed)
    return VecMonitor(venv)


# --- checkpoints ------------------------------------------------------------------------------------

_CKPT = re.compile(r"rl_model_(\d+)_steps\.zip$")


def latest_checkpoint(ckpt_dir: Path) -> tuple[Path, Path | None] | None:
    """The newest loadable checkpoint (model zip, VecNormalize pickle) in ``ckpt_dir``."""
    if not ckpt_dir.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _CKPT.search(p.name))), reverse=True
    )
    for steps, model_path in found:
        norm = ckpt_dir / f"rl_model_vecnormalize_{steps}_steps.pkl"
        try:  # a checkpoint cut short by a crash fails to open: fall back to the one before it
            import zipfile

            with zipfile.ZipFile(model_path) as z:
                z.testzip()
        except Exception:
            log.warning("skipping unreadable checkpoint %s", model_path)
            continue
        return model_path, norm if norm.is_file() else None
    return None


# --- how a run starts -------------------------------------------------------------------------------


def _env_of_bundle(cfg: TrainConfig, base: PolicyBundle) -> TrainConfig:
    """``cfg`` with the fine-tuned bundle's observation schema and action set in its env (unless
    set); a different one set explicitly is refused, naming the field."""
    from dataclasses import replace as dc_replace

    meta = base.meta
    own = {"obs_schema": int(meta.schema_version), "action_set": list(meta.action_set)}
    if meta.split != "policy":
        own.update(split=meta.split, split_tolerance=meta.split_tolerance)
    env = dict(cfg.env)
    for key, value in own.items():
        if (
            key in env
            and env[key] is not None
            and np.atleast_1d(env[key]).tolist() != np.atleast_1d(value).tolist()
        ):
            raise ValueError(f"env.{key}={env[key]} but finetune_from {base.path} was trained with {value}")
        env[key] = value
    return dc_replace(cfg, env=env)


def _normalised_like(
    cfg: TrainConfig, venv: VecEnv, base: PolicyBundle, state_of_worker_dim: int | None = None
):
    """``venv`` normalised as ``cfg`` asks, starting from the fine-tuned bundle's observation
    statistics (extended to a centralised critic's state when ``state_of_worker_dim`` is given),
    frozen with ``freeze_obs_norm``."""
    if not (cfg.normalize_obs or cfg.normalize_reward):
        return venv
    venv = VecNormalize(venv, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward)
    if base.obs_norm is not None:  # start from the pretrained statistics
        mean, var = base.obs_norm.mean.copy(), base.obs_norm.var.copy()
        if state_of_worker_dim is not None:
            mean, var = extend_obs_stats(mean, var, state_of_worker_dim)
        venv.obs_rms.mean, venv.obs_rms.var = mean, var
        venv.obs_rms.count = 1e4
        if cfg.freeze_obs_norm:
            freeze_obs_stats(venv)
    elif cfg.freeze_obs_norm:
        raise ValueError(
            f"freeze_obs_norm=true but finetune_from {base.path} has no observation statistics to keep"
        )
    return venv


def _central_from_bundle(cfg: TrainConfig, base: PolicyBundle, venv: VecEnv, algo, run_dir: Path):
    """A centralised-critic model seeded by a local-critic bundle (``finetune_from`` with
    ``critic=centralised``): the bundle's actor and critic weights (zero weights on the state's
    inputs), its PPO settings under ``cfg.ppo``, its observation statistics extended to the state."""
    for name, have, want in (("algorithm", base.meta.algorithm, cfg.algorithm),
                             ("action_mode", base.meta.action_mode, cfg.action_mode),
                             ("critic", base.meta.critic, "local")):  # fmt: skip
        if have != want:
            raise ValueError(
                f"finetune_from {base.path} has {name}={have!r}; critic=centralised needs {want!r}"
            )
    schema = venv.get_attr("obs_schema", [0])[0]
    venv = _normalised_like(cfg, venv, base, state_of_worker_dim=schema.worker_dim)
    ppo = {**dict(base.meta.config.get("ppo") or {}), **cfg.ppo}
    policy_kwargs = {**dict(base.model.policy_kwargs), "actor_dim": schema.per_worker_dim}
    model = algo(
        central_policy_class(cfg.algorithm),
        venv,
        seed=cfg.seed,
        device="cpu",
        tensorboard_log=str(run_dir / "tb"),
        policy_kwargs=policy_kwargs,
        **ppo,
    )
    from_local_bundle(model, base.model.policy, schema.worker_dim)
    return model


@dataclass
class Start:
    """Where PPO starts: the model on its (normalised) training env, and what the start brought."""

    model: BaseAlgorithm
    venv: VecEnv
    reset_timesteps: bool
    resumed: bool = False
    warm_start_stats: dict[str, Any] = field(default_factory=dict)
    expert_data: Any = None  # the warm start's cloned data (ExpertData), for the cloning term


def _resume(
    cfg: TrainConfig, venv: VecEnv, algo, run_dir: Path, checkpoint: tuple[Path, Path | None]
) -> Start:
    """The newest checkpoint of ``run_dir`` with its VecNormalize statistics."""
    model_path, norm_path = checkpoint
    log.info("resuming from %s", model_path)
    if norm_path is not None:
        venv = VecNormalize.load(str(norm_path), venv)
    elif cfg.normalize_obs or cfg.normalize_reward:
        venv = VecNormalize(venv, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward)
    model = algo.load(model_path, env=venv, device="cpu", tensorboard_log=str(run_dir / "tb"))
    return Start(model, venv, reset_timesteps=False, resumed=True)


def _finetune(cfg: TrainConfig, venv: VecEnv, algo, run_dir: Path, deadline: float | None = None) -> Start:
    """The bundle ``finetune_from`` with every ``ppo`` setting replacing its own; with
    ``expert_pretrain``, DAgger from its weights, its observation statistics kept (they are what
    its weights read)."""
    base = load_bundle(cfg.finetune_from)
    for name, have, want in (("algorithm", base.meta.algorithm, cfg.algorithm),
                             ("action_mode", base.meta.action_mode, cfg.action_mode),
                             ("critic", base.meta.critic, cfg.critic)):  # fmt: skip
        if have != want:
            raise ValueError(
                f"finetune_from {cfg.finetune_from} was trained with {name}={have!r}; set {name}={have}"
            )
    venv = _normalised_like(cfg, venv, base)
    # Every ppo setting replaces the bundle's (SB3 rebuilds the schedules and the rollout buffer
    # from them when it loads); one PPO does not take is an error, never silently dropped.
    unknown = sorted(set(cfg.ppo) - FINETUNE_PPO_KEYS)
    if unknown:
        raise ValueError(
            f"ppo.{unknown[0]} cannot be set when fine-tuning (finetune_from); settable: {sorted(FINETUNE_PPO_KEYS)}"
        )
    model = algo.load(
        base.path / "model.zip",
        env=venv,
        device="cpu",
        tensorboard_log=str(run_dir / "tb"),
        custom_objects=dict(cfg.ppo),
    )
    model.set_random_seed(cfg.seed)
    start = Start(model, venv, reset_timesteps=True)
    if cfg.expert_pretrain:
        start.warm_start_stats, start.expert_data = warm_start(
            cfg, model, venv, keep_obs_stats=base.obs_norm is not None, deadline=deadline
        )
    return start


def _fresh(cfg: TrainConfig, venv: VecEnv, algo, run_dir: Path, deadline: float | None = None) -> Start:
    """A new policy, warm-started from ``expert_pretrain``'s expert when set."""
    if cfg.normalize_obs or cfg.normalize_reward:
        venv = VecNormalize(
            venv,
            norm_obs=cfg.normalize_obs,
            norm_reward=cfg.normalize_reward,
            gamma=cfg.ppo.get("gamma", 0.99),
        )
    central = cfg.critic == "centralised"
    policy_kwargs = dict(cfg.policy_kwargs)
    if central:
        policy_kwargs["actor_dim"] = venv.get_attr("obs_schema", [0])[0].per_worker_dim
    model = algo(
        central_policy_class(cfg.algorithm) if central else "MlpPolicy",
        venv,
        seed=cfg.seed,
        device="cpu",
        tensorboard_log=str(run_dir / "tb"),
        policy_kwargs=policy_kwargs or None,
        **cfg.ppo,
    )
    start = Start(model, venv, reset_timesteps=True)
    if cfg.expert_pretrain:
        start.warm_start_stats, start.expert_data = warm_start(cfg, model, venv, deadline=deadline)
        if cfg.freeze_obs_norm:
            freeze_obs_stats(venv)
    return start


def start_model(cfg: TrainConfig, venv: VecEnv, run_dir: Path, deadline: float | None = None) -> Start:
    """Resume the newest checkpoint (``resume``), else fine-tune ``finetune_from`` (into a
    centralised critic with ``critic=centralised``; with ``expert_pretrain``, DAgger from the
    bundle's own weights first), else start a fresh policy. ``deadline``: no DAgger round of a
    warm start begins after it (``max_train_s``)."""
    algo = algorithm_class(cfg.algorithm)
    checkpoint = latest_checkpoint(run_dir / "checkpoints") if cfg.resume else None
    if checkpoint is not None:
        return _resume(cfg, venv, algo, run_dir, checkpoint)
    if cfg.finetune_from and cfg.critic == "centralised":
        model = _central_from_bundle(cfg, load_bundle(cfg.finetune_from), venv, algo, run_dir)
        return Start(model, model.get_env(), reset_timesteps=True)
    if cfg.finetune_from:
        return _finetune(cfg, venv, algo, run_dir, deadline)
    return _fresh(cfg, venv, algo, run_dir, deadline)


def cloning_term(cfg: TrainConfig, start: Start, run_dir: Path) -> list[BaseCallback]:
    """The cloning term kept during PPO (``expert_pretrain.bc_coef > 0``), its data saved beside
    the run for a resumed run to read; [] when off."""
    opts = cfg.expert_pretrain
    if opts is None or not opts.bc_coef > 0:
        return []
    data_file = run_dir / "expert_data.npz"
    data = start.expert_data
    if data is not None:
        data.save(data_file)
    elif start.resumed and data_file.is_file():
        from dynamix_gym.learning.imitation import ExpertData

        data = ExpertData.load(data_file)
    if data is None:
        raise ValueError(
            "expert_pretrain.bc_coef > 0 needs the warm start's expert data: a fresh run, or a resumed "
            f"one whose {data_file} exists (not finetune_from)"
        )
    return [
        BehaviourCloningTerm(
            data,
            float(opts.bc_coef),
            int(opts.bc_steps),
            batch_size=int(opts.bc_batch_size),
            learning_rate=float(cfg.ppo.get("learning_rate", 3e-4)),
            per_episode=bool(opts.episode_weighting),
            seed=cfg.seed + 31,
        )
    ]


def bundle_meta_fn(
    cfg: TrainConfig, start: Start, config_dict: dict[str, Any] | None
) -> Callable[[], BundleMeta]:
    """The metadata of a bundle of this run at the moment it is saved (what the envs encoded and
    took: the schema, the action set, the split)."""
    venv = start.venv
    action_set = list(venv.get_attr("action_set", [0])[0])
    schema = venv.get_attr("obs_schema", [0])[0]
    split = venv.get_attr("split", [0])[0], float(venv.get_attr("split_tolerance", [0])[0])

    def meta_fn() -> BundleMeta:
        return BundleMeta(
            obs_form=cfg.obs_form,
            action_set=[float(a) for a in action_set]
            if cfg.action_mode == "scale"
            else [int(a) for a in action_set],
            action_mode=cfg.action_mode,
            algorithm=cfg.algorithm,
            split=split[0],
            split_tolerance=split[1],
            critic=cfg.critic,
            schema_version=schema.version,
            feature_names=schema.per_worker_names(),
            num_workers=cfg.centralised_workers if cfg.obs_form == "centralised" else None,
            config=config_dict or {},
            metadata={
                "timesteps": int(start.model.num_timesteps),
                "seed": cfg.seed,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "warm_start": start.warm_start_stats,
            },
        )

    return meta_fn


def train(cfg: TrainConfig, config_dict: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (or resume, or fine-tune) a PPO policy; returns a summary with the best validation score
    (time to accuracy, a missed target counting its budget)."""
    check_train_config(cfg)
    torch.set_num_threads(cfg.torch_threads)
    run_dir = Path(cfg.run_dir)
    ckpt_dir, best_dir, final_dir = run_dir / "checkpoints", run_dir / "best", run_dir / "policy"
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.finetune_from:
        cfg = _env_of_bundle(cfg, load_bundle(cfg.finetune_from))
    # max_train_s bounds the warm start's DAgger rounds and the PPO updates together
    began = time.perf_counter()
    deadline = began + cfg.max_train_s if cfg.max_train_s is not None else None
    start = start_model(cfg, make_train_venv(cfg), run_dir, deadline)
    model, venv = start.model, start.venv
    bc_term = cloning_term(cfg, start, run_dir)
    meta_fn = bundle_meta_fn(cfg, start, config_dict)
    eval_cb = TTAEvalCallback(cfg, meta_fn, best_dir)
    clock = WallClockLimit(cfg.max_train_s, started=began) if cfg.max_train_s is not None else None
    callbacks = CallbackList(
        [
            *bc_term,
            *([CriticWarmup(cfg.critic_warmup_steps)] if cfg.critic_warmup_steps > 0 else []),
            RewardTermsCallback(),
            CheckpointCallback(
                save_freq=max(cfg.checkpoint_every // venv.num_envs, 1),
                save_path=str(ckpt_dir),
                save_vecnormalize=True,
            ),
            eval_cb,
            *([clock] if clock is not None else []),
        ]
    )
    remaining = cfg.total_timesteps - (model.num_timesteps if not start.reset_timesteps else 0)
    if start.warm_start_stats or (cfg.finetune_from and not start.resumed):
        # The warm-started (or fine-tuned) policy, before any PPO update, competes for "best" as
        # well: the learning curve's step 0.
        eval_cb.model = model
        first = eval_cb.evaluate()
        if start.warm_start_stats:
            start.warm_start_stats["validation_tta_s"] = first
    t0 = time.perf_counter()
    if remaining > 0:
        model.learn(
            total_timesteps=remaining,
            callback=callbacks,
            progress_bar=cfg.progress_bar,
            reset_num_timesteps=start.reset_timesteps,
            tb_log_name="ppo",
        )
    train_s = time.perf_counter() - t0
    eval_cb.evaluate()  # the final policy competes for "best" too
    norm = ObsNorm.from_vecnormalize(venv) if isinstance(venv, VecNormalize) and venv.norm_obs else None
    meta = meta_fn()
    meta.metadata["train_seconds"] = train_s
    if clock is not None:
        meta.metadata["stopped_by_wall_clock"] = clock.stopped
    save_bundle(final_dir, model, meta, norm)
    venv.close()
    return {
        "best_validation_tta_s": eval_cb.best,
        "history": eval_cb.history,
        "timesteps": int(model.num_timesteps),
        "train_seconds": train_s,
        "seconds": time.perf_counter() - began,  # the warm start and validation included
        "warm_start": start.warm_start_stats or None,
        "stopped_by_wall_clock": bool(clock is not None and clock.stopped),
        "best_bundle": str(best_dir),
        "final_bundle": str(final_dir),
    }
