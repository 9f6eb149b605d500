"""One decision step: what turns an interval report into the next batches, written once.

The env (:class:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv`), the arbitrator service
(:mod:`dynamix_gym.service.server`) and the torchrun drop-in (``adapters/dropin.py``) each hold one
:class:`DecisionStep` and call it at every interval boundary, so that a policy decides alike in all
three by construction:

1. :meth:`DecisionStep.observe`: the report is encoded (the schema's encoder and its short history),
   the last measured reconfiguration pause is kept (:func:`~dynamix_gym.actions.observed_reconfig_s`,
   read by the ``balanced_cost`` split), the end conditions are checked (target reached: terminated;
   time budget or ``max_decisions`` spent: truncated) and the reward of the interval is computed
   (:func:`~dynamix_gym.reward.compute_reward`);
2. :meth:`DecisionStep.masks`: the legal steps of a discrete action mode from the batches in force;
3. :meth:`DecisionStep.act`: the action becomes batches by the action rule (mode, steps, clipping:
   :class:`~dynamix_gym.actions.ActionRule`) and the split (:func:`~dynamix_gym.actions.split_batches`
   over the last report, with the observed pause);
4. :meth:`DecisionStep.guarded`: where the decision layer owns the guards (the drop-in), the
   watchdog's verdict on the interval and, while the fallback holds control, its batches instead.
   A backend that runs the guards itself (:class:`sim.guards.GuardedBackend`: the simulator, the DDP
   backend) judges the interval inside ``run_interval``; :meth:`DecisionStep.ran` then takes the
   batches that ran.

:func:`policy_forward` is the one inference of a PPO bundle's policy (the in-process controller and
the service): one pass through the SB3 actor-critic, masked, deterministic or sampled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynamix_gym.actions import (
    DEFAULT_SPLIT_TOLERANCE,
    DISCRETE_ACTION_MODES,
    ActionRule,
    apply_action,
    observed_reconfig_s,
    split_batches,
    step_masks,
)
from dynamix_gym.obs import DEFAULT_SCHEMA_VERSION, make_encoder
from dynamix_gym.obs.v4 import require_compute_curve
from dynamix_gym.reward import RewardConfig, compute_reward
from sim.protocol import BackendSpec, IntervalReport

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Observed:
    """What one report tells the decision layer."""

    obs: np.ndarray  # the encoded observation (centralised form)
    reward: float | None  # the interval's reward (None: the episode's first report, or no reward)
    terms: dict[str, float]  # the reward's terms
    terminated: bool  # the validation quality reached the target
    truncated: bool  # not terminated, and the time budget or max_decisions is spent


@dataclass(frozen=True, slots=True)
class Move:
    """An action turned into batches."""

    requested: np.ndarray  # the action rule's batches (clipped to the workers' ranges), before the split
    clipped: list[dict[str, int]]  # the clippings to the workers' ranges
    batches: np.ndarray  # the batches to run: the split of ``requested``


class DecisionStep:
    """The encoder, the action rule and split, the end conditions and the reward of one job.

    Args:
        spec: the backend's spec (workers, batch ranges, target, time budget).
        rule: how an action becomes batches (:class:`~dynamix_gym.actions.ActionRule`).
        encoder: the observation encoder (:func:`~dynamix_gym.obs.make_encoder`).
        reward: the reward (``None``: none is computed, as in the drop-in).
        time_budget_s: truncates the episode once a report's wall time reaches it (``None``: the
            spec's).
        max_decisions: truncates it after this many decisions (``None``: no limit).
    """

    def __init__(
        self,
        spec: BackendSpec,
        rule: ActionRule,
        encoder: Any,
        reward: RewardConfig | None = None,
        time_budget_s: float | None = None,
        max_decisions: int | None = None,
    ) -> None:
        self.spec = spec
        self.rule = rule
        self.encoder = encoder
        self.reward = reward
        self.time_budget_s = float(spec.time_budget_s if time_budget_s is None else time_budget_s)
        self.max_decisions = max_decisions
        self.reset()

    @classmethod
    def for_options(
        cls, spec: BackendSpec, action_mode: str, options: dict[str, Any], **kwargs: Any
    ) -> DecisionStep:
        """A step for a controller's env options (:func:`~dynamix_gym.controllers.base.env_options`:
        a bundle's schema, steps and split; else the env's defaults); ``kwargs`` go to the step."""
        rule = ActionRule.for_spec(
            action_mode,
            spec,
            options.get("action_set"),
            options.get("split", "policy"),
            options.get("split_tolerance", DEFAULT_SPLIT_TOLERANCE),
        )
        version = options.get("obs_schema", DEFAULT_SCHEMA_VERSION)
        require_compute_curve(str(version), spec)  # before any interval runs, not at the first encode
        encoder = make_encoder(version, spec)
        return cls(spec, rule, encoder, **kwargs)

    def reset(self) -> None:
        """A fresh episode: no history, no report, no pause measured, no decision made."""
        self.encoder.reset()
        self.last_report: IntervalReport | None = None
        self.reconfig_s: float | None = None
        self.prev_val_accuracy: float | None = None
        self.decisions = 0

    # --- at each interval boundary ----------------------------------------------------------------
    def observe(self, report: IntervalReport) -> Observed:
        """Take one interval's report: every report after the episode's first follows a decision."""
        if self.last_report is not None:
            self.decisions += 1
        self.last_report = report
        self.reconfig_s = observed_reconfig_s(self.reconfig_s, report)
        obs = self.encoder.encode(report)
        terminated = bool(report.val_accuracy >= self.spec.target_accuracy)
        truncated = not terminated and (
            report.wall_time_s >= self.time_budget_s
            or (self.max_decisions is not None and self.decisions >= self.max_decisions)
        )
        reward, terms = None, {}
        if self.reward is not None and self.prev_val_accuracy is not None:
            reward, terms = compute_reward(self.reward, report, self.prev_val_accuracy, terminated)
        self.prev_val_accuracy = float(report.val_accuracy)
        return Observed(obs, reward, terms, terminated, truncated)

    def masks(self, batches: np.ndarray) -> np.ndarray:
        """(N, len(steps)) bool: the steps of a discrete mode that keep each worker in its range."""
        rule = self.rule
        if rule.mode not in DISCRETE_ACTION_MODES:
            raise ValueError(
                f"action masks exist in the discrete action modes {list(DISCRETE_ACTION_MODES)}; this "
                f"decision step is in {rule.mode!r} mode"
            )
        return step_masks(rule.mode, rule.steps, batches, self.spec.min_batch, self.spec.max_batch)

    def act(self, action: Any, batches: np.ndarray, rule: ActionRule | None = None) -> Move:
        """The batches ``action`` asks for from ``batches`` (those in force) by ``rule`` (default:
        this step's), split over the last report with the observed pause."""
        rule = self.rule if rule is None else rule
        requested, clipped = apply_action(action, rule.mode, rule.steps, rule.space, batches, self.spec)
        new = split_batches(
            rule.split, requested, batches, self.last_report, self.spec, rule.split_tolerance, self.reconfig_s
        )
        return Move(requested, clipped, new)

    def ran(self, report: IntervalReport, batches: np.ndarray, guard: Any) -> np.ndarray:
        """The batches that ran: ``report``'s when a guarded backend (its ``guard``) may have run
        its fallback's instead of ``batches``."""
        return report.local_batch.astype(np.int64) if guard is not None else batches

    def guarded(
        self,
        guard: Any,
        report: IntervalReport,
        interval: int,
        batches: np.ndarray,
        proposed: np.ndarray,
        fallback: Callable[[], np.ndarray] | None = None,
    ) -> tuple[np.ndarray, str]:
        """The guards at a decision (:class:`sim.guards.Guard`, owned by the decision layer): the
        watchdog's verdict on ``report`` (the ``interval``-th, run at ``batches``) and the batches
        that follow: ``proposed`` (the policy's), or, at a rollback and while the fallback holds
        control, the snapshot's (``"hold"``: ``fallback`` None) or ``fallback()``'s. The caller
        restores its training state at ``"rollback"`` and keeps it at ``"snapshot"``."""
        seen = len(guard.events)
        verdict = guard.observe(
            interval, report.wall_time_s, report.val_accuracy, report.val_loss, batches.tolist()
        )
        if verdict == "rollback":
            guard.rolled_back(report.wall_time_s)
            guard.fallback_intervals += 1  # the interval run again from the snapshot, as a backend counts it
        for event in guard.events[seen:]:
            log.warning("%s", event.describe())
        if verdict == "rollback" or guard.fallback_decides():
            proposed = np.asarray(guard.held_batches, dtype=np.int64) if fallback is None else fallback()
        return proposed, verdict


# --------------------------------------------------------------------------------------------------
# Policy inference
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PolicyOutput:
    """One inference of a bundle's policy."""

    actions: np.ndarray  # (N,) int64: each worker's step index
    values: np.ndarray  # the critic's values (one per row)
    log_probs: np.ndarray  # (N,) the chosen actions' log-probabilities under the (masked) policy
    rows: np.ndarray  # the rows fed to the policy (normalised)


def policy_forward(
    bundle: Any,
    obs: np.ndarray,
    num_workers: int,
    masks: np.ndarray | None = None,
    explore: bool = False,
    rng: np.random.Generator | None = None,
) -> PolicyOutput:
    """A :class:`~dynamix_gym.controllers.bundle.PolicyBundle`'s actions for one centralised
    observation of ``num_workers`` workers.

    The bundle's form decides the rows: one per worker (``per_worker``, with the critic's cluster
    state where the bundle's critic is centralised) or the whole observation (``centralised``, a
    MultiDiscrete block per worker); its normalisation statistics apply. One pass through SB3's
    ActorCriticPolicy (what ``get_distribution`` and ``predict_values`` compute, without torch
    distribution objects: their per-call cost dominates these small networks). ``masks`` (N, A)
    bool: the legal steps; an illegal one gets probability zero, as in sb3-contrib's
    MaskableCategorical. The most likely action (SB3's deterministic ``predict``) unless
    ``explore``, when each worker's action is drawn from the policy with ``rng``.
    """
    import torch

    from dynamix_gym.obs import get_schema

    meta = bundle.meta
    per_worker = meta.obs_form == "per_worker"
    obs = np.asarray(obs, dtype=np.float32)
    if per_worker:
        schema = get_schema(meta.schema_version)
        rows = schema.split_centralised(obs, num_workers)
        if getattr(meta, "critic", "local") == "centralised":  # the actor ignores it; the input has it
            from dynamix_gym.learning.central_critic import with_critic_state

            rows = with_critic_state(rows, schema.worker_dim)
    else:
        rows = obs[None, :]
    if bundle.obs_norm is not None:
        rows = bundle.obs_norm(rows)
    policy = bundle.model.policy
    with torch.no_grad():
        t = torch.as_tensor(rows, dtype=torch.float32)
        features = policy.extract_features(t)
        if policy.share_features_extractor:
            latent_pi, latent_vf = policy.mlp_extractor(features)
        else:
            latent_pi = policy.mlp_extractor.forward_actor(features[0])
            latent_vf = policy.mlp_extractor.forward_critic(features[1])
        logits = policy.action_net(latent_pi).numpy().astype(np.float64)
        values = policy.value_net(latent_vf).numpy().reshape(-1)
    if not per_worker:  # MultiDiscrete: one block of logits per worker
        logits = logits.reshape(num_workers, -1)
    if masks is not None:
        logits = np.where(masks, logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    if explore:
        if rng is None:
            raise ValueError("policy_forward(explore=True) draws with rng: pass a numpy Generator")
        cum = np.cumsum(probs, axis=1)
        u = rng.random((probs.shape[0], 1)) * cum[:, -1:]
        actions = np.minimum((u > cum).sum(axis=1), probs.shape[1] - 1)
    else:
        actions = probs.argmax(axis=1)
    logp = np.log(np.maximum(probs[np.arange(len(actions)), actions], 1e-12))
    return PolicyOutput(actions.astype(np.int64), values, logp, rows)
