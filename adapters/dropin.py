"""Rank 0's half of the torchrun drop-in (:mod:`adapters.torchrun`): from an interval's report to the
batches every rank runs next.

The policy (a baseline, a PPO bundle, or the arbitrator's client) decides through the env's own
decision step (:class:`dynamix_gym.decision.DecisionStep`: the bundle's schema, steps and split,
the end conditions), and the guards' watchdog judges each interval there too; no process group is
needed here, so the decision is tested against the env's and the service's on the same reports.
"""

from __future__ import annotations

import numpy as np

from dynamix_gym.actions import ActionRule
from dynamix_gym.controllers.base import Controller, env_options
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.decision import DecisionStep
from sim.guards import Guard
from sim.protocol import BackendSpec, IntervalReport


class DropInDecider:
    """The policy, the guards' fallback and the decision step of one drop-in job (rank 0).

    Args:
        spec: the job's spec (ranks, batch ranges, target, time budget).
        guard: the job's guards (:class:`sim.guards.Guard`); its fallback decides while it holds control.
        policy: the controller that decides (a baseline, a PPO bundle's, the arbitrator's client).
        seed: seeds the policy's and the fallback's generators.
    """

    def __init__(self, spec: BackendSpec, guard: Guard, policy: Controller, seed: int = 0) -> None:
        self.spec, self.guard, self.policy = spec, guard, policy
        # what the policy's env would be built with: a bundle's schema, steps and split (else the env's
        # defaults: schema 1, the mode's default steps, the policy's own split)
        self.step = DecisionStep.for_options(spec, policy.action_mode, env_options(policy))
        policy.reset(spec, np.random.default_rng(seed))
        self.fallback: Controller | None = None
        if guard.config.acts and guard.config.fallback != "hold":
            self.fallback = make_controller(guard.config.fallback)
            self.fallback_rule = ActionRule.for_spec(self.fallback.action_mode, spec)
            self.fallback.reset(spec, np.random.default_rng(seed))

    def decide(
        self, report: IntervalReport, batches: np.ndarray, decisions: int
    ) -> tuple[np.ndarray, bool, str]:
        """The batches after ``report`` (the ``decisions``-th interval, run at ``batches``), whether
        the job is done (target or time budget reached) and the guards' verdict (``"snapshot"``,
        ``"rollback"`` or ``""``)."""
        seen = self.step.observe(report)
        info = {"report": report, "local_batches": batches.copy()}
        action, _ = self.policy.predict(seen.obs, info, deterministic=True)
        new = self.step.act(action, batches).batches

        def fallback() -> np.ndarray:
            action, _ = self.fallback.predict(seen.obs, info, deterministic=True)
            return self.step.act(action, batches, rule=self.fallback_rule).batches

        new, verdict = self.step.guarded(
            self.guard, report, decisions, batches, new, None if self.fallback is None else fallback
        )
        return new, seen.terminated or seen.truncated, verdict
