"""HeteroClusterEnv: DYNAMIX's per-worker batch-size decision problem over any training backend."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dynamix_gym.actions import (  # the action names are re-exported for the envs built on this one
    ACTION_MODES,
    CONTINUOUS_SCALE,
    DEFAULT_ACTION_SET,
    DEFAULT_SCALE_SET,
    DISCRETE_ACTION_MODES,
    SPLIT_MODES,
    ActionRule,
    apply_action,
    check_in_range,
    step_masks,
)
from dynamix_gym.decision import DecisionStep, Observed
from dynamix_gym.obs import check_schema_version, get_schema, make_encoder
from dynamix_gym.reward import RewardConfig
from sim.protocol import Backend, IntervalReport


class HeteroClusterEnv(gym.Env):
    """
    ## Description
    Synchronous data-parallel training on a heterogeneous cluster (T4s beside V100s by default).
    Every step the agent sets each worker's local batch; the backend then trains for ``interval``
    (K) iterations and reports what it measured. The slowest worker sets the pace of each
    iteration, faults (throttling, interference, network jitter) come and go, and the gradient
    noise scale grows as training progresses, so the best batches keep moving. This is the decision
    problem of DYNAMIX (arXiv 2510.08522). The backend is the simulator by default and a real
    PyTorch DDP job with ``dynamix/RealDDP-v0``; the env's code is the same for both.

    ## Action Space
    ``action_mode="delta"`` (default): ``MultiDiscrete([len(action_set)] * N)``; worker i's local
    batch moves by ``action_set[a_i]`` (default {-100, -25, 0, +25, +100}) and is then kept within
    [min batch, the GPU's memory cap]; each such clipping is listed in ``info["clipped"]``.
    ``"absolute"``: ``Box(min_batch, max_batch, (N,))``: the target local batch of each worker
    (rounded to an integer), so rule-based controllers are not limited to delta steps.
    ``"continuous"``: ``Box(-1, 1, (N,))``: local batch scaled by ``1 + 0.2 a_i``, i.e. within
    [0.8, 1.2], rounded and clipped like delta actions.
    ``"scale"``: ``MultiDiscrete([len(action_set)] * N)``; worker i's local batch becomes
    ``round(b_i * action_set[a_i])`` (default factors x{1/2, 4/5, 1, 5/4, 2}; the set must hold 1),
    steps that mean the same on every workload's batch range.
    In the discrete modes (``delta``, ``scale``) :meth:`action_masks` gives the steps that keep each
    worker within [min batch, memory cap], flat as sb3-contrib's ``MaskablePPO`` reads them
    (:meth:`action_mask_matrix`: one row per worker); an unmasked step outside is clipped and listed
    in ``info["clipped"]``.
    ``split="balanced"`` (any mode; default ``"policy"``) keeps only the *sum* of the batches an
    action asks for over the live workers, the global batch, and shares it in proportion to each
    worker's measured throughput in the last interval (:func:`dynamix_gym.actions.balanced_split`;
    no move within ``split_tolerance``): the policy chooses the global batch and the split follows
    the cluster, so that same-type workers cannot drift apart. ``split="balanced_cost"`` also keeps
    the batches in force when the global batch moves by no more than the tolerance and the re-split
    would save less compute time over the next interval than the last measured reconfiguration
    pause. ``info["requested_batches"]`` holds the action's batches before the split.

    ## Observation Space
    ``obs_schema=2`` selects the scale-free schema 2 instead: ``Box(-1, 1, (N * 14 + 15,),
    float32)``, table in :mod:`dynamix_gym.obs.v2` (batches against the worker's range and the
    noise scale, times and throughput as trends against the run's first interval, gradient
    statistics as ratios); ``obs_schema=3`` adds the job's learning-rate regime to it
    (``Box(-1, 1, (N * 14 + 17,), float32)``, :mod:`dynamix_gym.obs.v3`). Default, schema 1:
    ``Box(-1, 1, (N * 19 + 13,), float32)``: the 19 per-worker features of every worker, then the
    13 global features, each clipped to its raw range and mapped onto [-1, 1]
    (:data:`dynamix_gym.OBS_SCHEMA`; version 1):

    | index | name | unit | raw range | description |
    |---|---|---|---|---|
    | 19 i + 0 | net_throughput | log10(1 + MB/s) | [0, 4] | gradient traffic sent by the worker |
    | 19 i + 1 | tcp_retransmissions | log10(1 + segments/s) | [0, 5] | TCP retransmission rate |
    | 19 i + 2 | cpu_util | fraction | [0, 1] | host CPU utilisation |
    | 19 i + 3 | mem_util | fraction | [0, 1] | host memory utilisation |
    | 19 i + 4 | iteration_time | log10(s) | [-3, 2] | wall time per iteration |
    | 19 i + 5 | compute_time | log10(s) | [-3, 2] | input pipeline + forward + backward per iteration |
    | 19 i + 6 | idle_fraction | fraction | [0, 1] | share of the iteration spent waiting at the barrier |
    | 19 i + 7 | local_batch | log2(samples) | [2, 14] | current local batch |
    | 19 i + 8 | batch_accuracy | fraction | [0, 1] | training-batch accuracy over the interval |
    | 19 i + 9 | accuracy_gain | fraction | [-0.25, 0.25] | batch accuracy minus its value `window` intervals ago |
    | 19 i + 10 | grad_norm_mean | log10(norm) | [-4, 3] | mean local gradient norm |
    | 19 i + 11 | grad_norm_var | log10(norm^2) | [-10, 4] | variance of the local gradient norm |
    | 19 i + 12 | compute_share | fraction | [0, 1] | compute time / slowest live worker's compute time |
    | 19 i + 13 | batch_ratio | log2(ratio) | [-6, 6] | local batch / mean live local batch |
    | 19 i + 14 | speed_ratio | log2(ratio) | [-6, 6] | samples/s of compute / mean over live workers |
    | 19 i + 15 | headroom_up | log2(ratio) | [0, 10] | log2(memory-cap batch / local batch) |
    | 19 i + 16 | headroom_down | log2(ratio) | [0, 10] | log2(local batch / minimum batch) |
    | 19 i + 17 | gpu_util | fraction | [0, 1] | device busy fraction |
    | 19 i + 18 | alive | flag | [0, 1] | 1 if the worker took part in the interval |
    | 19 N + 0 | val_accuracy | fraction | [0, 1] | validation quality (accuracy, or the metric as a rising fraction) |
    | 19 N + 1 | val_loss | ln(C) units | [0, 2] | validation loss / ln(number of classes) |
    | 19 N + 2 | accuracy_to_target | fraction | [-0.5, 1] | target accuracy minus validation accuracy |
    | 19 N + 3 | val_accuracy_gain | fraction | [-0.25, 0.25] | validation accuracy minus its value `window` intervals ago |
    | 19 N + 4 | global_batch | log2(samples) | [4, 18] | sum of live local batches |
    | 19 N + 5 | noise_scale | log10(samples) | [0, 7] | gradient noise scale estimate (two-batch, EMA) |
    | 19 N + 6 | noise_to_batch | log2(ratio) | [-12, 12] | noise scale estimate / global batch |
    | 19 N + 7 | efficiency | fraction | [0, 1] | statistical efficiency E(M) from the estimate |
    | 19 N + 8 | time_used | fraction | [0, 1.5] | wall time / episode time budget |
    | 19 N + 9 | comm_fraction | fraction | [0, 1] | exposed all-reduce / iteration time |
    | 19 N + 10 | mean_idle_fraction | fraction | [0, 1] | idle fraction averaged over live workers |
    | 19 N + 11 | num_workers | log2(workers) | [0, 10] | live workers |
    | 19 N + 12 | interval_time | log10(s) | [-2, 4] | wall time of the last interval |

    ``val_accuracy`` (and the accuracy features after it) is the validation *quality*: the
    workload's metric mapped to a rising fraction by ``sim.workloads.QualityMetric`` (accuracy
    itself for the shipped workloads; ``1 - WER`` for a falling WER in [0, 1]), so a falling metric
    needs no special case here, in the reward or in the episode's end.

    ## Rewards
    ``reward="dynamix"`` (default): acc + alpha max(0, gain) - beta T_iter - delta reg(B)
    - eta (var|g| + std|g|); ``reward="time"``: minus the interval's wall time (minutes by
    default) plus a bonus on reaching the target. See :mod:`dynamix_gym.reward`; every term is in
    ``info["reward_terms"]``.

    ## Starting State
    A fresh training run at time zero; every worker at the backend's initial local batch. The first
    observation comes from one warm-up interval at those batches.

    ## Episode End
    ``terminated`` when the measured validation quality reaches the workload's target;
    ``truncated`` when the wall-clock budget or ``max_decisions`` steps are used up.

    ## Arguments
    ``gymnasium.make("dynamix/HeteroCluster-v0", cluster=None, workload=None,
    scenario="static_hetero", reward="dynamix", interval=50, workers=None, action_mode="delta",
    action_set=None, max_decisions=None, time_budget_s=None, initial_batch=None, window=4,
    backend=None, sim_kwargs=None, profile=None, obs_schema=1, split="policy",
    split_tolerance=0.1)``. ``action_set=None`` is the
    mode's default (deltas (-100, -25, 0, 25, 100); factors (0.5, 0.8, 1, 1.25, 2) in ``scale``
    mode); ``obs_schema`` is 1 (absolute, DYNAMIX's), 2 (scale-free) or 3 (scale-free with the
    learning-rate regime). ``workers=N``
    builds the default T4/V100 mix with N workers; ``backend`` (any :class:`dynamix_gym.Backend`)
    replaces the simulator; ``reward`` is a kind name, a mapping of :class:`RewardConfig` fields or
    a config. ``profile`` (a calibrated cluster profile's path or name, :mod:`sim.profile`)
    makes the simulator use its fitted models; ``cluster`` and ``workload`` then default to the
    profile's (``None`` otherwise means ``"t4v100"`` and ``"cifar10"``).

    ## Version History
    * v0: initial version (observation schema 1); a workload's metric may fall (WER, loss): the
      observation, reward and target see it as a rising quality (same dynamics for accuracy);
      opt-in, defaults unchanged: ``obs_schema=2`` (scale-free observations) and
      ``action_mode="scale"`` with :meth:`action_masks`.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        cluster: Any = None,
        workload: Any = None,
        scenario: Any = "static_hetero",
        reward: str | dict | RewardConfig | None = "dynamix",
        interval: int = 50,
        workers: int | None = None,
        action_mode: str = "delta",
        action_set: Sequence[float] | None = None,
        max_decisions: int | None = None,
        time_budget_s: float | None = None,
        initial_batch: int | None = None,
        window: int = 4,
        backend: Backend | None = None,
        sim_kwargs: dict[str, Any] | None = None,
        profile: Any = None,
        obs_schema: int | str = 1,
        split: str = "policy",
        split_tolerance: float = 0.1,
    ) -> None:
        super().__init__()
        self.obs_schema = get_schema(check_schema_version("obs_schema", obs_schema))
        if action_mode not in ACTION_MODES:
            raise ValueError(f"unknown action_mode {action_mode!r}; choose one of {list(ACTION_MODES)}")
        if isinstance(interval, bool) or not isinstance(interval, int | np.integer) or interval < 1:
            raise ValueError(f"interval (K iterations per step) must be an integer >= 1, got {interval!r}")
        if max_decisions is not None and max_decisions < 1:
            raise ValueError(f"max_decisions must be >= 1 or None, got {max_decisions!r}")
        if time_budget_s is not None and not 0.0 < float(time_budget_s) < math.inf:
            raise ValueError(
                f"time_budget_s must be a number of seconds in (0, inf) or None, got {time_budget_s!r}"
            )
        if backend is None:
            from dynamix_gym.backends.sim_backend import SimBackend

            backend = SimBackend(
                cluster,
                workload,
                scenario,
                workers=workers,
                initial_batch=initial_batch,
                time_budget_s=time_budget_s,
                profile=profile,
                **(sim_kwargs or {}),
            )
        self.backend = backend
        self.interval = int(interval)
        #: the one decision step (dynamix_gym.decision): encoder, action rule and split, end, reward
        rule = ActionRule.for_spec(action_mode, backend.spec, action_set, split, split_tolerance)
        encoder = make_encoder(self.obs_schema.version, backend.spec, window=window)
        self.decision = DecisionStep(
            backend.spec, rule, encoder, RewardConfig.from_any(reward), time_budget_s, max_decisions
        )
        self.action_mode, self.action_set = rule.mode, rule.steps
        self.split, self.split_tolerance = rule.split, rule.split_tolerance
        self._fallback = self._guard_fallback()
        n = backend.spec.num_workers
        self.num_workers = n
        self.observation_space = spaces.Box(-1.0, 1.0, (self.obs_schema.centralised_dim(n),), np.float32)
        self.action_space = rule.space
        self._reset_done = False
        self._episode_over = False

    # --- what the decision step owns ------------------------------------------------------------------
    @property
    def encoder(self) -> Any:
        return self.decision.encoder

    @property
    def reward_config(self) -> RewardConfig:
        return self.decision.reward

    @reward_config.setter
    def reward_config(self, value: RewardConfig) -> None:
        self.decision.reward = value

    @property
    def time_budget_s(self) -> float:
        return self.decision.time_budget_s

    @time_budget_s.setter
    def time_budget_s(self, value: float) -> None:
        self.decision.time_budget_s = float(value)

    @property
    def max_decisions(self) -> int | None:
        return self.decision.max_decisions

    @property
    def decisions(self) -> int:
        return self.decision.decisions

    @property
    def last_report(self) -> IntervalReport | None:
        return self.decision.last_report

    @property
    def _reconfig_s(self) -> float | None:
        return self.decision.reconfig_s

    # --- gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Starts an episode. ``options={"initial_batches": [b_0, ..., b_N-1]}`` runs the warm-up
        interval at those local batches instead of the backend's initial batch (a static batch
        starting as it means to go on); each must lie in its worker's [min, max]."""
        super().reset(seed=seed)
        unknown = sorted(set(options or {}) - {"initial_batches"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; known: ['initial_batches']")
        initial = (options or {}).get("initial_batches")
        return self._start_episode(None if initial is None else self._check_initial(initial))

    def _check_initial(self, initial: Any) -> np.ndarray:
        spec = self.backend.spec
        b = np.asarray(initial)
        if b.shape != (self.num_workers,) or b.dtype.kind not in "iuf" or not np.all(b == np.round(b)):
            raise ValueError(
                f"reset option initial_batches must be {self.num_workers} whole numbers, got {initial!r}"
            )
        return check_in_range(b, spec, "reset option initial_batches")

    def _start_episode(self, initial: np.ndarray | None = None):
        """Fresh backend run and warm-up interval (``self.np_random`` already seeded)."""
        self.backend.reset(rng=self.np_random)
        if self.backend.spec is not self.decision.spec:  # e.g. a compute curve measured since (schema 4)
            self._rebuild_decision(self.decision.time_budget_s)
        self.decision.reset()
        if self._fallback is not None:  # a child stream: the episode's own draws do not move
            self._fallback[0].reset(self.backend.spec, self.np_random.spawn(1)[0])
        start = self.backend.spec.initial_batch if initial is None else initial
        self.batches = start.astype(np.int64).copy()
        self._observe(self.backend.run_interval(self.batches, self.interval))
        self._reset_done = True
        self._episode_over = False
        info = self._info(self.last_report, clipped=[], terms={})
        return self._obs(), info

    def step(self, action):
        if not self._reset_done:
            raise RuntimeError("HeteroClusterEnv.step() called before reset()")
        if self._episode_over:
            raise RuntimeError("the episode has ended (terminated or truncated); call reset() first")
        guard = getattr(self.backend, "guard", None)
        if self._fallback is not None and guard.fallback_decides():
            fallback, rule = self._fallback  # a named fallback decides for the guards' cool-down
            info = {"report": self.last_report, "local_batches": self.batches.copy()}
            fallback_action, _ = fallback.predict(self._obs(), info, deterministic=True)
            move = self.decision.act(fallback_action, self.batches, rule=rule)
        else:
            move = self.decision.act(action, self.batches)
        self.batches = move.batches
        report = self.backend.run_interval(move.batches, self.interval)
        # a guarded backend (sim.guards) may have run its fallback's batches instead
        self.batches = self.decision.ran(report, move.batches, guard)
        out = self._observe(report)
        terminated, truncated = out.terminated, out.truncated
        self._episode_over = terminated or truncated
        info = self._info(report, move.clipped, out.terms)
        info["requested_batches"] = move.requested
        if terminated:
            info["time_to_accuracy_s"] = report.wall_time_s
        return self._obs(), out.reward, terminated, truncated, info

    def close(self) -> None:
        self.backend.close()

    # --- helpers ------------------------------------------------------------------------------------
    def apply_action(self, action) -> tuple[np.ndarray, list[dict[str, int]]]:
        """New local batches for ``action`` and the list of clippings to the workers' ranges (the
        action rule alone, before the split)."""
        rule = self.decision.rule
        return apply_action(action, rule.mode, rule.steps, rule.space, self.batches, self.backend.spec)

    def action_mask_matrix(self) -> np.ndarray:
        """(N, len(action_set)) bool: step j is legal for worker i when it keeps the worker's local
        batch within [min_batch_i, max_batch_i] (discrete modes; computed from the batches in force)."""
        if self.action_mode not in DISCRETE_ACTION_MODES:
            raise ValueError(
                f"action masks exist in the discrete action modes {list(DISCRETE_ACTION_MODES)}; this env "
                f"is in {self.action_mode!r} mode"
            )
        if not self._reset_done:
            raise RuntimeError("HeteroClusterEnv.action_masks() called before reset()")
        return self.decision.masks(self.batches)

    def action_masks(self) -> np.ndarray:
        """The legal steps as one flat bool vector of ``N * len(action_set)`` entries (worker 0's
        steps first): the form sb3-contrib's ``MaskablePPO`` reads for a ``MultiDiscrete`` space.
        An unmasked illegal step is still clipped to the worker's range and listed in
        ``info["clipped"]``."""
        return self.action_mask_matrix().reshape(-1)

    def _observe(self, report: IntervalReport) -> Observed:
        """The decision step's view of ``report`` (the observation kept for :meth:`_obs`)."""
        out = self.decision.observe(report)
        self._obs_vec = out.obs
        return out

    def _obs(self) -> np.ndarray:
        return self._obs_vec.copy()

    def per_worker_observations(self) -> np.ndarray:
        """(N, Fw + Fg): the current observation as one row per worker (shared-policy form)."""
        return self.obs_schema.split_centralised(self._obs_vec, self.num_workers)

    def set_backend(self, backend: Backend) -> None:
        """Swap the backend between episodes (same number of workers; not in absolute mode)."""
        if backend.spec.num_workers != self.num_workers:
            raise ValueError(
                f"the new backend has {backend.spec.num_workers} workers, this env has {self.num_workers}"
            )
        if self.action_mode == "absolute":
            raise ValueError("set_backend would change the absolute-mode action space; build a new env")
        self.backend.close()
        self.backend = backend
        self._rebuild_decision(None)

    def _rebuild_decision(self, time_budget_s: float | None) -> None:
        """The decision step (rule, encoder) over the backend's current spec, as before otherwise."""
        backend, old = self.backend, self.decision
        rule = ActionRule.for_spec(old.rule.mode, backend.spec, old.rule.steps, old.rule.split,
                                   old.rule.split_tolerance)  # fmt: skip
        encoder = make_encoder(self.obs_schema.version, backend.spec, window=old.encoder.window)
        self.decision = DecisionStep(
            backend.spec, rule, encoder, old.reward, time_budget_s, old.max_decisions
        )
        self._fallback = self._guard_fallback()

    def _guard_fallback(self) -> tuple[Any, ActionRule] | None:
        """The controller a guarded backend's ``fallback`` names, with its action rule (None for
        ``"hold"``, which the backend carries out itself, or without acting guards)."""
        guard = getattr(self.backend, "guard", None)
        if guard is None or not guard.config.acts or guard.config.fallback == "hold":
            return None
        from dynamix_gym.controllers.registry import make_controller  # controllers build envs

        fallback = make_controller(guard.config.fallback)
        return fallback, ActionRule.for_spec(fallback.action_mode, self.backend.spec)

    def _info(self, report: IntervalReport, clipped: list, terms: dict[str, float]) -> dict[str, Any]:
        return {
            "report": report,
            "local_batches": self.batches.copy(),
            "clipped": clipped,
            "reward_terms": terms,
            "wall_time_s": report.wall_time_s,
            "val_accuracy": report.val_accuracy,
            "decisions": self.decisions,
            # simulation only: the backend's noise-free models, for oracles (sim.protocol.GroundTruth)
            "ground_truth": getattr(self.backend, "ground_truth", None),
            # a guarded backend's counts so far (sim.guards.Guard.summary); None without guards
            "guard": guard.summary() if (guard := getattr(self.backend, "guard", None)) is not None else None,
        }


__all__ = [
    "ACTION_MODES",
    "CONTINUOUS_SCALE",
    "DEFAULT_ACTION_SET",
    "DEFAULT_SCALE_SET",
    "DISCRETE_ACTION_MODES",
    "SPLIT_MODES",
    "HeteroClusterEnv",
    "step_masks",
]
