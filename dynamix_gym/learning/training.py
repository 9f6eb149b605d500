"""PPO pretraining over simulated clusters: environments, callbacks, checkpoints and bundles.

The Hydra entry point ``python -m experiments.train`` is a thin shell around :func:`train`.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecMonitor, VecNormalize

from dynamix_gym.controllers.bundle import (
    BundleMeta,
    ObsNorm,
    PolicyBundle,
    PPOController,
    load_bundle,
    save_bundle,
)
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.randomized import TIME_SCALES, DomainRandomization, RandomizedClusterEnv
from dynamix_gym.envs.vec_env import PerWorkerVecEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.learning.central_critic import (
    CRITICS,
    central_policy_class,
    extend_obs_stats,
    from_local_bundle,
)
from dynamix_gym.learning.wallclock import WallClockLimit
from sim.validation import check_choice

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Everything :func:`train` needs. Each default is ``conf/train.yaml``'s (tests check it); the
    dict fields default to empty, i.e. the libraries' own defaults, where the app fills them from
    its groups (``conf/ppo``, ``conf/domain``, ``conf/reward``)."""

    run_dir: str
    seed: int = 0
    total_timesteps: int = 300_000
    obs_form: str = "per_worker"  # or "centralised"
    algorithm: str = "ppo"  # or "maskable_ppo" (sb3-contrib's MaskablePPO: illegal steps masked)
    action_mode: str = "delta"  # or "scale" (multiplicative steps); both discrete
    cluster_sizes: Sequence[int] = (4, 6, 8)  # one training cluster per entry
    centralised_workers: int = 8
    centralised_envs: int = 4
    subprocess: bool = False
    domain: dict[str, Any] = field(default_factory=dict)  # DomainRandomization fields (workers set per env)
    env: dict[str, Any] = field(default_factory=dict)  # HeteroClusterEnv kwargs (reward, interval, ...)
    ppo: dict[str, Any] = field(default_factory=dict)  # stable_baselines3.PPO kwargs
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    normalize_obs: bool = True
    normalize_reward: bool = True
    # Keep the observation statistics a policy was pretrained with (a warm start's expert data, a
    # fine-tuned bundle's) fixed during PPO: running updates move the inputs the pretrained policy
    # reads, e.g. its rare regime flags, and can undo it before PPO has learned anything.
    freeze_obs_norm: bool = False
    # The time reward's scale in the training worlds: "fixed" (the reward's time_scale_s) or
    # "world" (each world's own time scale, so that every world's return reads near -1; see
    # RandomizedClusterEnv). Validation and evaluation measure minutes either way.
    time_scale: str = "fixed"
    # Timesteps at the start of PPO during which only the value function learns (the policy's
    # actor frozen): a fine-tuned or warm-started actor meets a critic fitted to another reward or
    # input first, whose advantages are noise until it has caught up.
    critic_warmup_steps: int = 0
    # "local" (the critic reads the worker's row, as the actor does) or "centralised" (MAPPO-style:
    # the row plus the cluster's state; the actor still reads the row alone; per-worker form only,
    # fresh or finetune_from a local-critic bundle; dynamix_gym.learning.central_critic).
    critic: str = "local"
    torch_threads: int = 1
    checkpoint_every: int = 50_000  # timesteps
    eval_every: int = 50_000  # timesteps
    eval_scenarios: Sequence[str] = ("static_hetero", "throttle", "mixed")
    eval_seeds: Sequence[int] = (1000, 1001)
    eval_workers: int = 8
    # Validation tasks instead of eval_scenarios (e.g. held-out tasks of the benchmark's train split):
    # each {"name", "cluster", "workload", "scenario", "interval"} with sim specs (the app resolves
    # conf names); every task runs at every seed of eval_seeds.
    eval_tasks: Sequence[dict[str, Any]] = ()
    progress_bar: bool = True
    resume: bool = True  # continue from the newest checkpoint in run_dir/checkpoints if any
    finetune_from: str | None = None  # start from this bundle instead of a fresh policy
    max_train_s: float | None = None  # wall-clock bound of the PPO updates (None: total_timesteps alone)
    # Behaviour-cloning warm start of a fresh policy from an expert controller (None: off), e.g.
    # {"expert": "oracle", "episodes": 120, "epochs": 20}, with the expert's parameters in
    # "expert_kwargs"; see dynamix_gym.learning.imitation.
    expert_pretrain: dict[str, Any] | None = None


ALGORITHMS = ("ppo", "maskable_ppo")


#: The PPO settings a fine-tuning run may change on the loaded bundle (conf/ppo/default.yaml's).
FINETUNE_PPO_KEYS = frozenset(
    ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range", "ent_coef",
     "vf_coef", "max_grad_norm")
)  # fmt: skip


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


def check_train_config(cfg: TrainConfig) -> None:
    """Refuse combinations that cannot train, naming the field."""
    algorithm_class(cfg.algorithm)
    if cfg.freeze_obs_norm and not (cfg.normalize_obs and (cfg.finetune_from or cfg.expert_pretrain)):
        raise ValueError(
            "freeze_obs_norm=true keeps pretrained observation statistics: it needs normalize_obs=true and "
            "finetune_from or expert_pretrain (a fresh policy has none to keep)"
        )
    check_choice("time_scale", cfg.time_scale, TIME_SCALES)
    if cfg.max_train_s is not None:
        WallClockLimit(cfg.max_train_s)  # its range check
    check_choice("critic", cfg.critic, CRITICS)
    if cfg.critic == "centralised":
        if cfg.obs_form != "per_worker":
            raise ValueError(
                "critic=centralised needs obs_form=per_worker (a shared actor on each worker's row)"
            )
        if cfg.expert_pretrain:
            raise ValueError(
                "critic=centralised cannot be warm-started by expert_pretrain (its rows carry no cluster "
                "state); warm-start a local-critic run, then finetune_from its bundle with critic=centralised"
            )
    if cfg.critic_warmup_steps < 0:
        raise ValueError(f"critic_warmup_steps must be >= 0, got {cfg.critic_warmup_steps}")
    if cfg.action_mode not in ("delta", "scale"):
        raise ValueError(
            f"action_mode must be 'delta' or 'scale' (the discrete modes), got {cfg.action_mode!r}"
        )
    if cfg.algorithm == "maskable_ppo" and cfg.obs_form != "per_worker":
        raise ValueError("algorithm=maskable_ppo needs obs_form=per_worker (one masked step per worker)")
    opts = dict(cfg.expert_pretrain or {})
    coef = float(opts.get("bc_coef", 0.0))
    if not 0.0 <= coef <= 100.0:
        raise ValueError(f"expert_pretrain.bc_coef must lie in [0, 100], got {coef}")
    if coef > 0 and cfg.finetune_from:
        raise ValueError(
            "expert_pretrain.bc_coef > 0 keeps cloning the warm start's data; finetune_from has none"
        )
    if coef > 0 and int(opts.get("bc_steps", 10)) < 1:
        raise ValueError(f"expert_pretrain.bc_steps must be >= 1, got {opts.get('bc_steps')}")


# --- environments -----------------------------------------------------------------------------------


def _cluster_env_fn(domain: dict, env_kwargs: dict, workers: int) -> Callable[[], HeteroClusterEnv]:
    def make() -> HeteroClusterEnv:
        return RandomizedClusterEnv(
            domain=DomainRandomization(**{**domain, "workers": workers}), **env_kwargs
        )

    return make


def train_env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The training worlds' env keywords: ``cfg.env`` plus the per-world time scale when set
    (validation envs take ``cfg.env`` alone)."""
    return {**cfg.env, **({"time_scale": cfg.time_scale} if cfg.time_scale != "fixed" else {})}


def make_train_venv(cfg: TrainConfig) -> VecEnv:
    """Randomised simulated clusters, per-worker (shared policy) or centralised, monitored."""
    env_kwargs = {**train_env_kwargs(cfg), "action_mode": cfg.action_mode}
    if cfg.obs_form == "per_worker":
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


# --- callbacks --------------------------------------------------------------------------------------


class BehaviourCloningTerm(BaseCallback):
    """Behaviour cloning kept up during PPO: after every rollout, ``steps`` minibatch gradient
    steps on ``coef`` x the expert data's (weighted) cross-entropy, with their own Adam.

    PPO's policy-gradient step and this one alternate, which optimises PPO's loss plus ``coef``
    times the imitation loss: the augmented objective of DAPG (Rajeswaran et al., RSS 2018), kept
    at a constant weight. Where the reward gives a clear signal RL moves the policy; where it
    barely does (long no-scaling-regime episodes, whose credit is spread over hundreds of
    decisions) the imitation term holds the policy at its teacher. Observations are normalised with
    the training env's current statistics at every step.
    """

    def __init__(
        self,
        data,
        coef: float,
        steps: int,
        batch_size: int = 1024,
        learning_rate: float = 3e-5,
        per_episode: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not coef > 0:
            raise ValueError(f"expert_pretrain.bc_coef must be > 0 to keep a cloning term, got {coef}")
        if int(steps) < 1:
            raise ValueError(f"expert_pretrain.bc_steps must be >= 1, got {steps}")
        self.data, self.coef, self.steps = data, float(coef), int(steps)
        self.batch_size, self.learning_rate = int(batch_size), float(learning_rate)
        self.weights = torch.as_tensor(data.weights(per_episode))
        self.gen = np.random.default_rng(seed)
        self.opt = None
        self.losses: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        policy = self.model.policy
        if self.opt is None:
            self.opt = torch.optim.Adam(policy.parameters(), lr=self.learning_rate)
        venv = self.model.get_env()
        norm = venv.normalize_obs if isinstance(venv, VecNormalize) and venv.norm_obs else (lambda x: x)
        n = len(self.data.actions)
        policy.set_training_mode(True)
        total = 0.0
        for _ in range(self.steps):
            idx = self.gen.integers(n, size=min(self.batch_size, n))
            obs = torch.as_tensor(norm(self.data.obs[idx]), dtype=torch.float32)
            actions = torch.as_tensor(self.data.actions[idx])
            _, log_prob, _ = policy.evaluate_actions(obs, actions)
            loss = -self.coef * (self.weights[idx] * log_prob).mean()
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            self.opt.step()
            total += float(loss.detach())
        policy.set_training_mode(False)
        self.losses.append(total / self.steps)
        self.logger.record("train/bc_loss", total / self.steps)


class CriticWarmup(BaseCallback):
    """Freeze the policy's actor (its policy network and action head) for the first ``steps``
    timesteps of PPO, so that only the value function learns: the critic of a fine-tuned or
    warm-started policy may be fitted to another reward (``time_scale``) or input, and PPO's
    advantages are noise until it has caught up. The actor's parameters take no gradient, so
    Adam leaves them as they are; they thaw at the first rollout past ``steps``."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = int(steps)
        self.frozen = False

    def _actor_parameters(self):
        policy = self.model.policy
        yield from policy.mlp_extractor.policy_net.parameters()
        yield from policy.action_net.parameters()
        if not policy.share_features_extractor:
            yield from policy.pi_features_extractor.parameters()

    def _set(self, frozen: bool) -> None:
        for p in self._actor_parameters():
            p.requires_grad_(not frozen)
        self.frozen = frozen

    def _on_training_start(self) -> None:
        if self.model.num_timesteps < self.steps:
            self._set(True)

    def _on_rollout_end(self) -> None:
        if self.frozen and self.model.num_timesteps >= self.steps:
            self._set(False)
            log.info("critic warm-up over at %d steps: the actor learns", self.model.num_timesteps)

    def _on_training_end(self) -> None:
        if self.frozen:
            self._set(False)

    def _on_step(self) -> bool:
        return True


class RewardTermsCallback(BaseCallback):
    """Logs the mean of every reward term and the time-to-accuracy of finished episodes."""

    def __init__(self) -> None:
        super().__init__()
        self._sums: dict[str, float] = {}
        self._count = 0
        self._tta: list[float] = []
        self._reached = 0
        self._ended = 0

    def _on_step(self) -> bool:
        infos = self.locals.get("infos", [])
        dones = self.locals.get("dones")
        for idx, info in enumerate(infos):
            cinfo = info.get("cluster_info", info if "reward_terms" in info else None)
            if cinfo is None:
                continue
            for k, v in cinfo.get("reward_terms", {}).items():
                self._sums[k] = self._sums.get(k, 0.0) + float(v)
            self._count += 1
            if dones is not None and dones[idx]:
                self._ended += 1
                if "time_to_accuracy_s" in cinfo:
                    self._reached += 1
                    self._tta.append(cinfo["time_to_accuracy_s"])
        return True

    def _on_rollout_end(self) -> None:
        for k, v in self._sums.items():
            self.logger.record(f"reward_terms/{k}", v / max(self._count, 1))
        if self._tta:
            self.logger.record("train/time_to_accuracy_min", float(np.mean(self._tta)) / 60.0)
        if self._ended:
            self.logger.record("train/reached_target_fraction", self._reached / self._ended)
        self._sums, self._count, self._tta, self._reached, self._ended = {}, 0, [], 0, 0


#: A validation "scenario" that stands for episodes drawn from the training domain (one per seed).
DOMAIN_SCENARIO = "domain"


def evaluate_policy_tta(
    controller: PPOController,
    scenarios: Sequence[str],
    seeds: Sequence[int],
    workers: int,
    env_kwargs: dict,
    domain: dict | None = None,
    action_mode: str = "delta",
    tasks: Sequence[dict[str, Any]] = (),
) -> dict[str, float]:
    """Mean time-to-accuracy (s) of ``controller`` per validation scenario (twice the episode's time
    if the target was not reached). The scenario ``"domain"`` draws each seed's cluster, faults and
    workload from ``domain`` (the training domain randomisation) instead of a named preset. With
    ``tasks`` (see :attr:`TrainConfig.eval_tasks`) the tasks replace the scenarios, keyed by name."""
    out = {}
    kw = {**env_kwargs, "action_mode": action_mode}

    def score(make_env, scenario) -> float:
        times = []
        for seed in seeds:
            env = make_env()
            res = run_episode(env, controller, seed=seed, scenario=scenario)
            env.close()
            s = res.summary
            times.append(s["time_to_accuracy_s"] if s["reached_target"] else s["total_time_s"] * 2.0)
        return float(np.mean(times))

    for task in tasks:
        spec = {k: task[k] for k in ("cluster", "workload", "scenario")}
        task_kw = {**kw, "interval": int(task.get("interval", kw.get("interval", 50)))}
        out[str(task["name"])] = score(lambda spec=spec, task_kw=task_kw: HeteroClusterEnv(**spec, **task_kw),
                                       getattr(task["scenario"], "name", None))  # fmt: skip
    for scenario in () if tasks else scenarios:
        if scenario == DOMAIN_SCENARIO:
            dom = DomainRandomization(**{**(domain or {}), "workers": workers})
            out[scenario] = score(lambda dom=dom: RandomizedClusterEnv(domain=dom, **kw), scenario)
        else:
            out[scenario] = score(
                lambda sc=scenario: HeteroClusterEnv(workers=workers, scenario=sc, **kw), scenario
            )
    return out


class TTAEvalCallback(BaseCallback):
    """Every ``eval_every`` steps: time-to-accuracy on validation scenarios; keeps the best bundle."""

    def __init__(self, cfg: TrainConfig, meta_fn: Callable[[], BundleMeta], best_dir: Path) -> None:
        super().__init__()
        self.cfg = cfg
        self.meta_fn = meta_fn
        self.best_dir = best_dir
        self.best = math.inf
        self.history: list[dict[str, Any]] = []
        self._next = cfg.eval_every

    def _current_norm(self) -> ObsNorm | None:
        venv = self.model.get_env()
        return ObsNorm.from_vecnormalize(venv) if isinstance(venv, VecNormalize) and venv.norm_obs else None

    def evaluate(self) -> float:
        bundle = PolicyBundle(self.best_dir, self.meta_fn(), self.model, self._current_norm())
        env_kwargs = {k: v for k, v in self.cfg.env.items() if k != "action_mode"}
        # A centralised policy drives exactly the cluster size it was trained on.
        workers = (
            self.cfg.centralised_workers if self.cfg.obs_form == "centralised" else self.cfg.eval_workers
        )
        tta = evaluate_policy_tta(
            PPOController(bundle=bundle),
            self.cfg.eval_scenarios,
            self.cfg.eval_seeds,
            workers,
            env_kwargs,
            domain=dict(self.cfg.domain),
            action_mode=self.cfg.action_mode,
            tasks=self.cfg.eval_tasks,
        )
        # Tasks of different workloads differ in scale by 10-100x: their geometric mean weighs a
        # relative gain alike on each; the presets (one workload) keep the arithmetic mean.
        values = list(tta.values())
        mean = float(np.exp(np.mean(np.log(values)))) if self.cfg.eval_tasks else float(np.mean(values))
        logger = getattr(self.model, "_logger", None)  # absent before learn() (warm-start evaluation)
        if logger is not None:
            for k, v in tta.items():
                logger.record(f"eval/tta_min_{k}", v / 60.0)
            logger.record("eval/tta_min_mean", mean / 60.0)
        self.history.append({"timesteps": int(self.num_timesteps), "tta_s": tta, "mean_tta_s": mean})
        if mean < self.best:
            self.best = mean
            meta = self.meta_fn()
            meta.metadata["validation_tta_s"] = tta
            meta.metadata["validation_timesteps"] = int(self.num_timesteps)
            save_bundle(self.best_dir, self.model, meta, self._current_norm())
            log.info(
                "new best validation time-to-accuracy %.1f min at %d steps", mean / 60, self.num_timesteps
            )
        return mean

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next:
            self._next += self.cfg.eval_every
            self.evaluate()
        return True


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


# --- training ---------------------------------------------------------------------------------------


#: Bump when the simulator or the expert changes what a rollout records: cached rollouts of an
#: older version are then never read.
EXPERT_CACHE_VERSION = 1


def _expert_cache_path(cache_dir: str | None, collect: dict[str, Any]) -> Path | None:
    """Where the expert's own rollouts (not DAgger's, which depend on the learner) are cached:
    ``<cache_dir>/expert-<hash of everything they depend on>.npz``; None without a cache dir."""
    if not cache_dir:
        return None
    import hashlib
    import json

    # TrainConfig holds plain containers (the app converts its config): JSON of them is the key
    key = json.dumps({"version": EXPERT_CACHE_VERSION, **collect}, sort_keys=True, default=str)
    return Path(cache_dir) / f"expert-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


def _warm_start(cfg: TrainConfig, model: PPO, venv: VecEnv) -> tuple[dict[str, Any], Any]:
    """Behaviour cloning from an expert (dynamix_gym.learning.imitation); also seeds VecNormalize's
    observation and return statistics with the expert's data so PPO starts where BC left off.
    Returns the statistics and the data cloned (expert and DAgger rows: the cloning term's)."""
    from dynamix_gym.learning.imitation import ExpertData, collect_expert_data, pretrain

    opts = dict(cfg.expert_pretrain or {})
    expert = {
        "expert": str(opts.get("expert", "oracle")),
        "expert_kwargs": dict(opts.get("expert_kwargs") or {}),
    }
    t0 = time.perf_counter()
    gamma = float(cfg.ppo.get("gamma", 0.99))
    per_episode = bool(opts.get("episode_weighting", False))
    collect = dict(
        domain=cfg.domain,
        env_kwargs=train_env_kwargs(cfg),
        sizes=list(cfg.cluster_sizes),
        episodes=int(opts.get("episodes", 120)),
        gamma=gamma,
        seed=cfg.seed + 7919,
        **expert,
        action_mode=cfg.action_mode,
    )
    cache = _expert_cache_path(opts.get("cache_dir"), collect)
    if cache is not None and cache.is_file():
        data = ExpertData.load(cache)
        log.info("expert rollouts from the cache %s (%d samples)", cache, len(data.actions))
    else:
        data = collect_expert_data(**collect)
        if cache is not None:
            data.save(cache)
    scale = 1.0
    obs_fn = lambda x: x  # noqa: E731
    if isinstance(venv, VecNormalize):
        if venv.norm_obs:
            venv.obs_rms.mean = data.obs.mean(axis=0).astype(np.float64)
            venv.obs_rms.var = data.obs.var(axis=0).astype(np.float64)
            venv.obs_rms.count = float(len(data.obs))
            obs_fn = venv.normalize_obs
        if venv.norm_reward:
            venv.ret_rms.var = np.asarray(float(np.var(data.returns)))
            venv.ret_rms.count = float(len(data.returns))
            scale = float(np.sqrt(venv.ret_rms.var + venv.epsilon))
    expert_tta = data.mean_tta_s
    epochs = int(opts.get("epochs", 20))
    lr = float(opts.get("learning_rate", 1e-3))
    stats = pretrain(
        model, data, obs_fn, scale, epochs=epochs, learning_rate=lr, seed=cfg.seed, per_episode=per_episode
    )
    rounds = []
    for k in range(int(opts.get("dagger_rounds", 0))):
        # DAgger: the learner acts, the expert labels; retrain on everything gathered so far.
        new = collect_expert_data(
            cfg.domain,
            train_env_kwargs(cfg),
            list(cfg.cluster_sizes),
            episodes=int(opts.get("dagger_episodes", opts.get("episodes", 120))),
            gamma=gamma,
            seed=cfg.seed + 104729 * (k + 1),
            **expert,
            policy=model,
            obs_fn=obs_fn,
            action_mode=cfg.action_mode,
        )
        data = data + new
        stats = pretrain(
            model,
            data,
            obs_fn,
            scale,
            epochs=max(epochs // 2, 1),
            learning_rate=lr / 2,
            seed=cfg.seed + k + 1,
            per_episode=per_episode,
        )
        rounds.append({"learner_mean_tta_s": new.mean_tta_s, **stats})
    stats["dagger"] = rounds
    stats.update(
        expert=expert["expert"],
        episodes=data.episodes,
        expert_mean_tta_s=expert_tta,
        seconds=time.perf_counter() - t0,
    )
    log.info("warm start from %s: %s", stats["expert"], stats)
    return stats, data


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


def train(cfg: TrainConfig, config_dict: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (or resume, or fine-tune) a PPO policy; returns a summary with the best validation TTA."""
    check_train_config(cfg)
    torch.set_num_threads(cfg.torch_threads)
    algo = algorithm_class(cfg.algorithm)
    run_dir = Path(cfg.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    best_dir = run_dir / "best"
    final_dir = run_dir / "policy"
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.finetune_from:
        cfg = _env_of_bundle(cfg, load_bundle(cfg.finetune_from))
    venv = make_train_venv(cfg)
    warm_start_stats: dict[str, Any] = {}
    expert_data = None
    resume = latest_checkpoint(ckpt_dir) if cfg.resume else None
    if resume is not None:
        model_path, norm_path = resume
        log.info("resuming from %s", model_path)
        if norm_path is not None:
            venv = VecNormalize.load(str(norm_path), venv)
        elif cfg.normalize_obs or cfg.normalize_reward:
            venv = VecNormalize(venv, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward)
        model = algo.load(model_path, env=venv, device="cpu", tensorboard_log=str(run_dir / "tb"))
        reset_timesteps = False
    elif cfg.finetune_from and cfg.critic == "centralised":
        model = _central_from_bundle(cfg, load_bundle(cfg.finetune_from), venv, algo, run_dir)
        venv = model.get_env()
        reset_timesteps = True
    elif cfg.finetune_from:
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
        custom = dict(cfg.ppo)
        model = algo.load(
            base.path / "model.zip",
            env=venv,
            device="cpu",
            tensorboard_log=str(run_dir / "tb"),
            custom_objects=custom,
        )
        model.set_random_seed(cfg.seed)
        reset_timesteps = True
    else:
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
        reset_timesteps = True
        if cfg.expert_pretrain:
            warm_start_stats, expert_data = _warm_start(cfg, model, venv)
            if cfg.freeze_obs_norm:
                freeze_obs_stats(venv)
    opts = dict(cfg.expert_pretrain or {})
    keep_cloning = float(opts.get("bc_coef", 0.0)) > 0
    data_file = run_dir / "expert_data.npz"  # the cloning term's data, for a resumed run
    if keep_cloning and expert_data is not None:
        expert_data.save(data_file)
    elif keep_cloning and resume is not None and data_file.is_file():
        from dynamix_gym.learning.imitation import ExpertData

        expert_data = ExpertData.load(data_file)

    action_set = list(venv.get_attr("action_set", [0])[0])
    schema = venv.get_attr("obs_schema", [0])[0]  # the bundle records what the envs encoded
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
                "timesteps": int(model.num_timesteps),
                "seed": cfg.seed,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "warm_start": warm_start_stats,
            },
        )

    n_envs = venv.num_envs
    eval_cb = TTAEvalCallback(cfg, meta_fn, best_dir)
    bc_term = []
    if keep_cloning:
        if expert_data is None:
            raise ValueError(
                "expert_pretrain.bc_coef > 0 needs the warm start's expert data: a fresh run, or a resumed "
                f"one whose {data_file} exists (not finetune_from)"
            )
        bc_term = [
            BehaviourCloningTerm(
                expert_data,
                float(opts["bc_coef"]),
                int(opts.get("bc_steps", 10)),
                batch_size=int(opts.get("bc_batch_size", 1024)),
                learning_rate=float(cfg.ppo.get("learning_rate", 3e-4)),
                per_episode=bool(opts.get("episode_weighting", False)),
                seed=cfg.seed + 31,
            )
        ]
    clock = WallClockLimit(cfg.max_train_s) if cfg.max_train_s is not None else None
    callbacks = CallbackList(
        [
            *bc_term,
            *([CriticWarmup(cfg.critic_warmup_steps)] if cfg.critic_warmup_steps > 0 else []),
            RewardTermsCallback(),
            CheckpointCallback(
                save_freq=max(cfg.checkpoint_every // n_envs, 1),
                save_path=str(ckpt_dir),
                save_vecnormalize=True,
            ),
            eval_cb,
            *([clock] if clock is not None else []),
        ]
    )
    remaining = cfg.total_timesteps - (model.num_timesteps if not reset_timesteps else 0)
    if warm_start_stats or (cfg.finetune_from and resume is None):
        # The warm-started (or fine-tuned) policy, before any PPO update, competes for "best" as
        # well: the learning curve's step 0.
        eval_cb.model = model
        start = eval_cb.evaluate()
        if warm_start_stats:
            warm_start_stats["validation_tta_s"] = start
    t0 = time.perf_counter()
    if remaining > 0:
        model.learn(
            total_timesteps=remaining,
            callback=callbacks,
            progress_bar=cfg.progress_bar,
            reset_num_timesteps=reset_timesteps,
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
        "stopped_by_wall_clock": bool(clock is not None and clock.stopped),
        "best_bundle": str(best_dir),
        "final_bundle": str(final_dir),
    }
