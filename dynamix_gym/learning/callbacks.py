"""The PPO trainer's callbacks: the cloning term kept during PPO, the critic's warm-up, the reward
terms' log, and validation on held-out scenarios or benchmark tasks (which keeps the best bundle)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecNormalize

from dynamix_gym.benchmark.scoring import geomean
from dynamix_gym.benchmark.validation import evaluate_policy_tta
from dynamix_gym.controllers.bundle import BundleMeta, ObsNorm, PolicyBundle, PPOController, save_bundle
from dynamix_gym.learning.config import TrainConfig

log = logging.getLogger(__name__)


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
        mean = geomean(values) if self.cfg.eval_tasks else float(np.mean(values))
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
