"""Learners of the elastic problem: PPO (on the multidiscrete form) and an off-policy actor-critic
(SAC or TD3 on the continuous box form; the cloud scheduler used DDPG), one entry point.

    python -m experiments.train_elastic learner=ppo
    python -m experiments.train_elastic learner=sac

Bundles are the project's bundle directories (:func:`dynamix_gym.controllers.bundle.save_bundle`) whose
``bundle.json`` metadata names the env id, the algorithm and the action form, so a loader builds the
right SB3 class and refuses an env whose spaces differ.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO, SAC, TD3
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize

from dynamix_gym.controllers.bundle import BundleMeta, BundleMismatchError, ObsNorm, save_bundle
from dynamix_gym.elastic.baselines import ElasticSpec, make_elastic_controller
from dynamix_gym.elastic.evaluation import run_elastic_episode
from dynamix_gym.envs.elastic_cluster import LR_CHOICES, ElasticClusterEnv
from dynamix_gym.envs.hetero_cluster import DEFAULT_ACTION_SET
from sim.elastic import LR_RANGE

log = logging.getLogger(__name__)

ENV_ID = "dynamix/ElasticCluster-v0"
ALGOS = {"ppo": PPO, "sac": SAC, "td3": TD3}
#: The action form each learner drives.
ALGO_FORM = {"ppo": "multidiscrete", "sac": "box", "td3": "box"}


@dataclass
class ElasticExpertConfig:
    """The behaviour-cloning warm start of an elastic learner from a baseline
    (:func:`dynamix_gym.elastic.baselines.make_elastic_controller`)."""

    expert: str = "fixed"  # a baseline's kind
    params: dict[str, Any] = field(default_factory=dict)  # its parameters
    episodes: int = 24  # expert episodes, seeds 1000 + seed + i
    epochs: int = 40
    lr: float = 1e-3

    def __post_init__(self) -> None:
        for name in ("episodes", "epochs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"expert_pretrain.{name} must be >= 1, got {getattr(self, name)}")
        if not float(self.lr) > 0:
            raise ValueError(f"expert_pretrain.lr must be > 0, got {self.lr}")


@dataclass
class ElasticTrainConfig:
    """Everything :func:`train_elastic` needs (``python -m experiments.train_elastic``, whose
    ``conf/train_elastic.yaml`` and ``conf/learner/*.yaml`` are checked against these fields)."""

    run_dir: str
    algo: str = "ppo"
    seed: int = 100  # training and tuning seeds are >= 100; 0-4 are held out for the report
    total_timesteps: int = 60_000
    n_envs: int = 4
    env: dict[str, Any] = field(default_factory=dict)  # ElasticClusterEnv kwargs (action_form set by algo)
    algo_kwargs: dict[str, Any] = field(default_factory=dict)
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    normalize_obs: bool = True
    eval_every: int = 10_000
    eval_seeds: tuple[int, ...] = (100, 101, 102)
    torch_threads: int = 1
    # Behaviour-cloning warm start from a baseline (None: off), e.g.
    # {expert: fixed, params: {counts: {T4/spot: 4}}, episodes: 24, epochs: 40}
    expert_pretrain: ElasticExpertConfig | None = None
    # Gaussian exploration noise on the box action (SB3's NormalActionNoise, std in action units) for
    # the off-policy learners; TD3's own default is none, i.e. no exploration beyond the warm start.
    action_noise_sigma: float | None = None
    # Checkpoints are kept by validation dollars + this value of time x hours to accuracy: None, the
    # cost reward's own time_value_usd_per_hour (0 for the scheduler reward), i.e. by the objective
    # the reward optimises.
    select_time_value_usd_per_hour: float | None = None

    def __post_init__(self) -> None:
        self.eval_seeds = tuple(int(s) for s in self.eval_seeds)
        if isinstance(self.expert_pretrain, dict):
            from dynamix_gym.learning.config import structured

            self.expert_pretrain = structured(ElasticExpertConfig, self.expert_pretrain, "expert_pretrain")
        if self.algo not in ALGOS:
            raise ValueError(f"algo={self.algo!r} is not one of {list(ALGOS)}")
        if self.action_noise_sigma is not None:
            if self.algo == "ppo":
                raise ValueError(
                    "action_noise_sigma is for the off-policy learners (sac, td3); ppo samples its policy"
                )
            if not 0.0 < float(self.action_noise_sigma) <= 1.0:
                raise ValueError(f"action_noise_sigma must lie in (0, 1], got {self.action_noise_sigma!r}")
        if (
            self.select_time_value_usd_per_hour is not None
            and not 0.0 <= self.select_time_value_usd_per_hour < 1e6
        ):
            raise ValueError(
                f"select_time_value_usd_per_hour must lie in [0, 1e6), got {self.select_time_value_usd_per_hour!r}"
            )
        if min(self.eval_seeds, default=100) < 100 or self.seed < 100:
            raise ValueError("seed and eval_seeds must be >= 100 (seeds 0-4 are held out for the report)")


def _env_kwargs(cfg: ElasticTrainConfig) -> dict[str, Any]:
    return {**cfg.env, "action_form": ALGO_FORM[cfg.algo]}


class ElasticPolicy:
    """A trained elastic bundle as a controller (``predict(obs, info)`` -> the env's flat action)."""

    name = "learned"
    uses_truth = False

    def __init__(self, model: Any, obs_norm: ObsNorm | None, meta: dict[str, Any]) -> None:
        self.model, self.obs_norm, self.meta = model, obs_norm, meta

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True):
        obs = self.obs_norm(observation) if self.obs_norm is not None else observation
        action, _ = self.model.predict(obs, deterministic=deterministic)
        return action, None


def save_elastic_bundle(
    path: Path, model: Any, cfg: ElasticTrainConfig, norm: ObsNorm | None, env: Any
) -> Path:
    meta = BundleMeta(
        obs_form="centralised",
        action_set=list(DEFAULT_ACTION_SET),
        num_workers=env.num_workers,
        config={"env": _env_kwargs(cfg), "algo_kwargs": cfg.algo_kwargs},
        metadata={
            "env_id": ENV_ID,
            "algo": cfg.algo,
            "action_form": env.action_form,
            "action_space": str(env.action_space),
            "obs_dim": int(env.obs_dim),
            "offers": list(env.offers),
            "timesteps": int(model.num_timesteps),
            "seed": cfg.seed,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    return save_bundle(path, model, meta, norm)


def load_elastic_bundle(path: str | Path, env: ElasticClusterEnv | None = None) -> ElasticPolicy:
    """Load an elastic bundle; with ``env``, refuse one trained for other spaces."""
    path = Path(path)
    raw = json.loads((path / "bundle.json").read_text())
    md = raw.get("metadata", {})
    if md.get("env_id") != ENV_ID:
        raise BundleMismatchError(f"{path} is not a {ENV_ID} bundle (env_id {md.get('env_id')!r})")
    if env is not None:
        env = env.unwrapped
        if str(env.action_space) != md["action_space"] or int(env.obs_dim) != int(md["obs_dim"]):
            raise BundleMismatchError(
                f"{path} was trained on action space {md['action_space']} and {md['obs_dim']} observation "
                f"features; this env has {env.action_space} and {env.obs_dim}"
            )
    model = ALGOS[md["algo"]].load(path / "model.zip", device="cpu")
    norm = None
    if (path / "obs_norm.npz").is_file():
        z = np.load(path / "obs_norm.npz")
        norm = ObsNorm(z["mean"], z["var"], float(z["clip"]), float(z["epsilon"]))
    return ElasticPolicy(model, norm, raw)


def evaluate(policy: ElasticPolicy, env_kwargs: dict[str, Any], seeds) -> dict[str, float]:
    """Mean dollars and time to accuracy over ``seeds`` (inf if any seed misses the target)."""
    rows = [run_elastic_episode(ElasticClusterEnv(**env_kwargs), policy, s) for s in seeds]
    return {
        "dollars_to_accuracy": float(np.mean([r["dollars_to_accuracy"] for r in rows])),
        "time_to_accuracy_s": float(np.mean([r["time_to_accuracy_s"] for r in rows])),
    }


def flat_action(env: ElasticClusterEnv, action: dict[str, Any]) -> np.ndarray:
    """The env's flat action (multidiscrete or box form) of a Dict action."""
    parts = env.to_dict_action(action)
    w = np.asarray(parts["workers"], dtype=np.int64)
    lr = float(parts["lr"])
    batch = np.asarray(parts.get("batch", np.zeros(0)))
    if env.action_form == "multidiscrete":
        k = int(np.argmin([abs(c - lr) for c in LR_CHOICES]))
        return np.concatenate([batch.astype(np.int64), w, [k]]).astype(np.int64)
    a_lr = 2.0 * math.log(lr / LR_RANGE[0]) / math.log(LR_RANGE[1] / LR_RANGE[0]) - 1.0
    return np.concatenate([batch.astype(np.float64), (w - 2) / 2.0, [a_lr]]).astype(np.float32)


def behaviour_clone(model: Any, venv: Any, cfg: ElasticTrainConfig) -> dict[str, float]:
    """Fit the policy to an expert's actions on episodes of seeds >= 1000 + cfg.seed; seeds the
    observation normaliser with the expert's observations. Returns the final log-likelihood."""
    spec = cfg.expert_pretrain
    kwargs = _env_kwargs(cfg)
    obs_list, act_list = [], []
    for i in range(int(spec.episodes)):
        env = ElasticClusterEnv(**kwargs)
        expert = make_elastic_controller(spec.expert, **dict(spec.params))
        obs, info = env.reset(seed=1000 + cfg.seed + i)
        expert.reset(ElasticSpec.from_env(env), np.random.default_rng(i))
        while True:
            action, _ = expert.predict(obs, info)
            obs_list.append(obs)
            act_list.append(flat_action(env, action))
            obs, _, term, trunc, info = env.step(action)
            if term or trunc:
                break
    obs_arr = np.asarray(obs_list, dtype=np.float64)
    if isinstance(venv, VecNormalize):
        venv.obs_rms.mean, venv.obs_rms.var = obs_arr.mean(axis=0), obs_arr.var(axis=0)
        venv.obs_rms.count = float(len(obs_arr))
        obs_arr = venv.normalize_obs(obs_arr)
    obs_t = torch.as_tensor(obs_arr, dtype=torch.float32)
    act_t = torch.as_tensor(np.asarray(act_list))
    policy = model.policy
    params = policy.actor.parameters() if cfg.algo != "ppo" else policy.parameters()
    opt = torch.optim.Adam(params, lr=float(spec.lr))
    n = len(obs_t)
    gen = torch.Generator().manual_seed(cfg.seed)
    loss = torch.tensor(0.0)
    for _ in range(int(spec.epochs)):
        for idx in torch.randperm(n, generator=gen).split(256):
            if cfg.algo == "ppo":
                _, logp, _ = policy.evaluate_actions(obs_t[idx], act_t[idx])
                loss = -logp.mean()
            else:
                # SAC's actor samples unless told not to; TD3's is deterministic and takes no flag.
                out = (
                    policy.actor(obs_t[idx], deterministic=True)
                    if cfg.algo == "sac"
                    else policy.actor(obs_t[idx])
                )
                loss = torch.nn.functional.mse_loss(out, act_t[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    if hasattr(model, "actor_target"):  # TD3: the target actor starts where the clone ended
        model.actor_target.load_state_dict(model.actor.state_dict())
    return {"samples": n, "final_loss": float(loss.detach())}


def train_elastic(cfg: ElasticTrainConfig, config_dict: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train a learner; keeps the bundle with the lowest validation objective (dollars plus the value of
    time, see ``select_time_value_usd_per_hour``; seeds >= 100)."""
    torch.set_num_threads(cfg.torch_threads)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    kwargs = _env_kwargs(cfg)
    venv = DummyVecEnv([lambda: ElasticClusterEnv(**kwargs) for _ in range(cfg.n_envs)])
    venv.seed(cfg.seed)
    venv = VecMonitor(venv)
    if cfg.normalize_obs:
        venv = VecNormalize(venv, norm_obs=True, norm_reward=True, gamma=cfg.algo_kwargs.get("gamma", 0.99))
    cls = ALGOS[cfg.algo]
    extra: dict[str, Any] = {}
    if cfg.action_noise_sigma is not None:
        dim = int(np.prod(venv.action_space.shape))
        extra["action_noise"] = NormalActionNoise(np.zeros(dim), np.full(dim, float(cfg.action_noise_sigma)))
    model = cls(
        "MlpPolicy",
        venv,
        seed=cfg.seed,
        device="cpu",
        policy_kwargs=dict(cfg.policy_kwargs) or None,
        **extra,
        **cfg.algo_kwargs,
    )
    probe_env = ElasticClusterEnv(**kwargs)
    value = cfg.select_time_value_usd_per_hour
    if value is None:
        reward = probe_env.reward_config
        value = reward.time_value_usd_per_hour if reward.kind == "cost" else 0.0

    def objective(score: dict[str, float]) -> tuple[float, float]:
        """(dollars + value of time, time): what a checkpoint is kept by."""
        t = score["time_to_accuracy_s"]
        return score["dollars_to_accuracy"] + value * t / 3600.0, t

    best = {"dollars_to_accuracy": math.inf, "time_to_accuracy_s": math.inf}
    history = []
    warm = behaviour_clone(model, venv, cfg) if cfg.expert_pretrain else {}

    def norm() -> ObsNorm | None:
        return ObsNorm.from_vecnormalize(venv) if isinstance(venv, VecNormalize) else None

    if warm:
        score = evaluate(ElasticPolicy(model, norm(), {}), kwargs, cfg.eval_seeds)
        score["objective_usd"] = objective(score)[0]
        warm.update(score)
        history.append({**score, "timesteps": 0})
        log.info("%s after behaviour cloning: validation %s", cfg.algo, score)
        best = score
        save_elastic_bundle(run_dir / "best", model, cfg, norm(), probe_env)
    t0 = time.perf_counter()
    done = 0
    while done < cfg.total_timesteps:
        chunk = min(cfg.eval_every, cfg.total_timesteps - done)
        model.learn(total_timesteps=chunk, reset_num_timesteps=False, progress_bar=False)
        done += chunk
        score = evaluate(ElasticPolicy(model, norm(), {}), kwargs, cfg.eval_seeds)
        score["timesteps"] = int(model.num_timesteps)
        history.append(score)
        log.info("%s at %d steps: validation %s", cfg.algo, model.num_timesteps, score)
        score["objective_usd"] = objective(score)[0]
        if not (run_dir / "best").exists() or objective(score) < objective(best):
            best = score
            save_elastic_bundle(run_dir / "best", model, cfg, norm(), probe_env)
    train_s = time.perf_counter() - t0
    save_elastic_bundle(run_dir / "policy", model, cfg, norm(), probe_env)
    venv.close()
    return {
        "algo": cfg.algo,
        "warm_start": warm,
        "best_validation": best,
        "history": history,
        "timesteps": int(model.num_timesteps),
        "train_seconds": train_s,
        "best_bundle": str(run_dir / "best"),
        "final_bundle": str(run_dir / "policy"),
    }
