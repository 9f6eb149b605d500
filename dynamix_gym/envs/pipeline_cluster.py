"""PipelineClusterEnv: where to cut a pipeline-parallel model, decided again under interference."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dynamix_gym.pipeline.planner import plan_cost_s, profile
from dynamix_gym.reward import RewardConfig, compute_reward
from sim.cluster import ClusterSpec
from sim.faults import Scenario
from sim.pipeline.model import PipelineModel, uniform_model
from sim.pipeline.partition import bounds, even_split, stage_memory_bytes
from sim.pipeline.report import PipelineReport
from sim.pipeline.simulator import PipelineSimulator

#: Per-stage features, in order (see the table in :class:`PipelineClusterEnv`).
STAGE_FEATURES = (
    "present",
    "blocks",
    "fwd_time",
    "bwd_time",
    "fwd_vs_mean",
    "send_time",
    "bubble",
    "idle",
    "gpu_util",
    "mem_util",
    "link_mbps",
)
#: Global features, in order.
GLOBAL_FEATURES = (
    "micro_batches",
    "iteration_time",
    "iteration_trend",
    "repartition_share",
    "stall_share",
    "val_accuracy",
    "to_target",
    "time_used",
    "num_blocks",
    "num_stages",
)
#: Per-boundary features of v1 (``move_gains``), in order.
MOVE_FEATURES = ("gain_left", "gain_right")
#: World maker: rng -> dict(cluster=, model=, scenario=, stages=) (generated pipelines for training).
WorldFn = Callable[[np.random.Generator], dict[str, Any]]


def _lin(x: float | np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip(2.0 * (np.asarray(x, dtype=np.float64) - lo) / (hi - lo) - 1.0, -1.0, 1.0)


def _log10(x, lo: float, hi: float) -> np.ndarray:
    return _lin(np.log10(np.maximum(np.asarray(x, dtype=np.float64), 10.0**lo)), lo, hi)


class PipelineClusterEnv(gym.Env):
    """
    ## Description
    Pipeline-parallel training of a sequential model cut into S stages on S groups of workers
    (:mod:`sim.pipeline`). Every ``interval`` (K) iterations the agent sees each stage's measured
    forward / backward / send times, bubble and idle fractions, device counters and link
    throughput, and the partition; it moves each boundary between neighbouring stages by one
    block and may change the number of micro-batches M. A throttled GPU, a noisy neighbour, a
    jittery link or a lost worker turns one stage into the whole pipeline's bottleneck; a
    re-partition moves blocks' state over the links and pauses the job.

    ## Action Space
    ``MultiDiscrete([3] * (max_stages - 1) + [len(micro_batch_set)])``. Entry i < max_stages - 1
    moves boundary i (between stage i and i + 1) by {-1, 0, +1} blocks: -1 hands stage i's last
    block to stage i + 1, +1 takes stage i + 1's first block. The last entry picks M from
    ``micro_batch_set``. :meth:`action_masks` (flat, as sb3-contrib's ``MaskablePPO`` reads them)
    allows only moves that leave every stage at least one block and within its memory cap, for
    ANY combination of the unmasked entries: stage i may lose its first block only if it holds
    >= 2, and its last block only if it holds >= 2 plus one for each other block it may lose; a
    stage may receive blocks only if it fits holding all it may receive, at the largest M allowed;
    M is allowed where the partition in force fits. Boundaries beyond S - 1 are padding (only 0).
    A masked entry is not applied (the boundary stays, M stays) and is listed in
    ``info["refused"]`` as ``(entry, value)``; an action outside the space is a ``ValueError``.

    ## Observation Space
    ``Box(-1, 1, (max_stages * 11 + (max_stages - 1) + 10 + 2 (max_stages - 1),), float32)`` (v0:
    without the last term): per stage (padded stages all -1) the 11 features below (``link_mbps``:
    the boundary after the stage; 0 for the last), then the ``max_stages - 1`` boundary positions,
    then 10 globals, then (v1) two move gains per boundary. Each raw value is
    clipped to its range and mapped linearly onto [-1, 1].

    | index | name | unit | raw range | description |
    |---|---|---|---|---|
    | 11 s + 0 | present | 0/1 | [0, 1] | stage s exists |
    | 11 s + 1 | blocks | fraction | [0, 1] | blocks of stage s / the model's blocks |
    | 11 s + 2 | fwd_time | log10 s | [-4, 1] | forward compute of one micro-batch |
    | 11 s + 3 | bwd_time | log10 s | [-4, 1] | backward compute of one micro-batch |
    | 11 s + 4 | fwd_vs_mean | log2 ratio | [-3, 3] | (fwd + bwd) over the stages' mean |
    | 11 s + 5 | send_time | log10 s | [-5, 0] | sending activations and gradients, per micro-batch |
    | 11 s + 6 | bubble | fraction | [0, 1] | share of the iterations' time the stage waits |
    | 11 s + 7 | idle | fraction | [0, 1] | share of the interval's wall time it does not compute |
    | 11 s + 8 | gpu_util | fraction | [0, 1] | device busy counter |
    | 11 s + 9 | mem_util | fraction | [0, 1] | stage memory over its worker's |
    | 11 s + 10 | link_mbps | log10 MB/s | [-1, 4] | bytes per second over the boundary after stage s |
    | 11 S_max + i | boundary i | fraction | [0, 1] | block index where stage i + 1 starts / blocks |
    | +0 | micro_batches | log2 | [0, 7] | M in force |
    | +1 | iteration_time | log10 s | [-3, 2] | mean iteration time of the interval |
    | +2 | iteration_trend | log2 ratio | [-3, 3] | against the first interval's |
    | +3 | repartition_share | fraction | [0, 1] | re-partition pause / interval wall time |
    | +4 | stall_share | fraction | [0, 1] | waiting for a lost worker / interval wall time |
    | +5 | val_accuracy | fraction | [0, 1] | measured validation quality |
    | +6 | to_target | fraction | [0, 1] | validation quality / target |
    | +7 | time_used | fraction | [0, 1] | wall time / time budget |
    | +8 | num_blocks | count | [0, 64] | the model's blocks |
    | +9 | num_stages | count | [0, max_stages] | S |
    | +10 + 2 i | gain_left | fraction | [-0.5, 0.5] | v1: boundary i moved by -1, predicted cut of the slowest stage's cost |
    | +11 + 2 i | gain_right | fraction | [-0.5, 0.5] | v1: boundary i moved by +1, the same |

    The v1 move gains (``move_gains=True``, ``max_stages - 1`` pairs; padded boundaries and moves
    that would empty a stage -1) read the quiet cluster's per-block profile taken at reset
    (:func:`~dynamix_gym.pipeline.planner.profile`, what PipeDream and DynPipe plan from) against
    the interval's measured stage times: each stage's slow-down is its measured (forward +
    backward) time over the profile's for its blocks, and a move's gain is
    ``1 - cost(moved) / cost(now)`` of PipeDream's objective (the slowest stage's cost,
    communication included) at those slow-downs. A positive gain: the move would shorten the
    slowest stage.

    ## Rewards
    ``time`` (:mod:`dynamix_gym.reward`): ``-interval_time_s / time_scale_s`` per step plus
    ``target_bonus`` when the target is reached; an episode's return is minus its wall time.

    ## Starting State
    ``reset(seed=, options=)``: a new run (for a ``world`` maker, a new world drawn from the seed;
    without a seed, the episode's seed is drawn from the env's generator);
    options ``stages`` (S, dividing the workers), ``sizes`` (the starting partition; default the
    even split by block count) and ``micro_batches`` (default ``micro_batch_set``'s middle value).
    The first interval runs on that plan; its report is ``info["report"]``.

    ## Episode End
    Terminated when the measured validation quality reaches the target; truncated at
    ``time_budget_s`` of wall time or ``max_decisions`` steps.

    ## Arguments
    ``cluster``, ``model``, ``scenario``, ``stages``, ``schedule`` (as
    :class:`~sim.pipeline.simulator.PipelineSimulator`), ``world`` (a :data:`WorldFn` replacing them
    per episode), ``interval`` (K, iterations per step; with ``interval_s`` the most), ``interval_s``
    (seconds a step should last: K follows the last measured iteration time; None: always K),
    ``max_stages``, ``micro_batch_set``, ``target_quality`` (None:
    the workload's), ``time_budget_s``, ``max_decisions``, ``reward`` (kind ``time`` only),
    ``simulator_kwargs``, ``start_planner`` (``(env, seed) -> options`` for a reset given none: a
    learner's episodes start from a planner's plan), ``move_gains`` (v1's features; False: v0's
    observation).

    ## Version History
    * v1: the move gains (two per boundary) after the globals; the default of the class.
    * v0: initial version (``move_gains=False``).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        cluster: str | ClusterSpec = "t4v100_4",
        model: PipelineModel | None = None,
        scenario: str | Scenario = "interference",
        *,
        stages: int | None = None,
        schedule: str = "1f1b",
        world: WorldFn | None = None,
        interval: int = 50,
        interval_s: float | None = 30.0,
        max_stages: int = 8,
        micro_batch_set: Sequence[int] = (4, 8, 16, 32),
        target_quality: float | None = 0.8,
        time_budget_s: float = 8 * 3600.0,
        max_decisions: int = 2000,
        reward: str | dict | RewardConfig = "time",
        simulator_kwargs: dict[str, Any] | None = None,
        start_planner: Callable[[Any, int], dict[str, Any]] | None = None,
        move_gains: bool = True,
    ) -> None:
        self.reward_cfg = RewardConfig.from_any(reward)
        if self.reward_cfg.kind != "time":
            raise ValueError(f"reward.kind must be 'time' for the pipeline env, got {self.reward_cfg.kind!r}")
        self.world = world
        self._fixed = dict(
            cluster=cluster, model=model or uniform_model(16), scenario=scenario, stages=stages
        )
        self.schedule = schedule
        self.interval = int(interval)
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1 iterations, got {interval}")
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds or None, got {interval_s}")
        self.interval_s = interval_s
        self.max_stages = int(max_stages)
        if self.max_stages < 2:
            raise ValueError(f"max_stages must be >= 2, got {max_stages}")
        self.micro_batch_set = tuple(int(m) for m in micro_batch_set)
        if not self.micro_batch_set or min(self.micro_batch_set) < 1:
            raise ValueError(f"micro_batch_set must hold integers >= 1, got {micro_batch_set!r}")
        self.target_quality = target_quality
        self.time_budget_s = float(time_budget_s)
        self.max_decisions = int(max_decisions)
        self.simulator_kwargs = dict(simulator_kwargs or {})
        self.start_planner = start_planner
        self.move_gains = bool(move_gains)
        n_obs = self.max_stages * len(STAGE_FEATURES) + (self.max_stages - 1) + len(GLOBAL_FEATURES)
        if self.move_gains:
            n_obs += (self.max_stages - 1) * len(MOVE_FEATURES)
        self.observation_space = spaces.Box(-1.0, 1.0, (n_obs,), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete([3] * (self.max_stages - 1) + [len(self.micro_batch_set)])
        self.sim: PipelineSimulator | None = None
        self._profile = None

    # --- episode -----------------------------------------------------------------------------------
    def _build(self, rng: np.random.Generator, stages: int | None) -> PipelineSimulator:
        spec = dict(self._fixed) if self.world is None else dict(self.world(rng))
        if stages is not None:
            spec["stages"] = stages
        sim = PipelineSimulator(
            spec["cluster"], spec["model"], spec["scenario"], stages=spec.get("stages"),
            schedule=self.schedule, **self.simulator_kwargs,
        )  # fmt: skip
        if sim.num_stages > self.max_stages:
            raise ValueError(
                f"the pipeline has {sim.num_stages} stages, more than max_stages={self.max_stages}"
            )
        return sim

    def simulator_for(self, seed: int | None, stages: int | None = None) -> PipelineSimulator:
        """The simulator ``reset(seed=seed)`` would build (the world is drawn from the seed alone), not
        reset: planners read its model, placement and quiet-cluster times before the run starts."""
        world_rng = np.random.default_rng(seed).spawn(2)[0]
        return self._build(world_rng, stages)

    def _backend(self, sim: PipelineSimulator):
        """What the episode runs on, given the simulator of its world: the simulator itself here; a
        real backend (``dynamix/RealPipeline-v0``) wraps it as its twin, with the same interface."""
        return sim

    def close(self) -> None:
        close = getattr(self.sim, "close", None)
        if close is not None and self.sim is not None and not isinstance(self.sim, PipelineSimulator):
            close()
        super().close()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        # the episode's seed draws the world and the run (a learner's reset without one: from np_random)
        self.episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31))
        if options is None and self.start_planner is not None:
            options = self.start_planner(self, self.episode_seed)
        options = dict(options or {})
        world_rng, sim_rng = np.random.default_rng(self.episode_seed).spawn(2)
        self.sim = self._backend(self._build(world_rng, options.get("stages")))
        self.sim.reset(rng=sim_rng)
        self._profile = None  # the quiet profile, on first use (quiet_profile)
        n = self.sim.model.num_blocks
        self.sizes = tuple(options.get("sizes") or even_split(n, self.sim.num_stages))
        m = options.get("micro_batches", self.micro_batch_set[len(self.micro_batch_set) // 2])
        if m not in self.micro_batch_set:
            raise ValueError(f"options['micro_batches'] must be one of {self.micro_batch_set}, got {m!r}")
        self.micro_batches = int(m)
        self.target = self.sim.target_quality if self.target_quality is None else float(self.target_quality)
        self.decisions = 0
        report = self.sim.run_interval(self.sizes, self.micro_batches, self.interval)
        self._first_iteration_s = report.iteration_time_s
        self._report = report
        return self._obs(report), self._info(report)

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("PipelineClusterEnv.step() called before reset()")
        sizes, m, refused = self.decode(action)
        report = self.sim.run_interval(sizes, m, self.iterations_next())
        self.sizes, self.micro_batches, self._report = sizes, m, report
        self.decisions += 1
        terminated = bool(report.val_accuracy >= self.target)
        truncated = not terminated and (
            report.wall_time_s >= self.time_budget_s or self.decisions >= self.max_decisions
        )
        reward, terms = compute_reward(self.reward_cfg, report, None, terminated)
        info = self._info(report)
        info["reward_terms"] = terms
        info["refused"] = refused
        return self._obs(report), reward, terminated, truncated, info

    def iterations_next(self) -> int:
        """K of the next interval: ``interval``, or with ``interval_s`` the iterations that last
        about ``interval_s`` at the last measured iteration time, within [1, ``interval``]."""
        if self.interval_s is None:
            return self.interval
        k = int(self.interval_s / max(self._report.iteration_time_s, 1e-9))
        return max(1, min(self.interval, k))

    # --- actions -----------------------------------------------------------------------------------
    def decode(self, action) -> tuple[tuple[int, ...], int, list[tuple[int, int]]]:
        """The partition and M an action asks for, and its masked entries (not applied)."""
        a = np.asarray(action, dtype=np.int64).reshape(-1).copy()
        if a.shape != (self.max_stages,) or np.any(a < 0) or np.any(a >= self.action_space.nvec):
            raise ValueError(f"action must be an element of {self.action_space}, got {action!r}")
        mask = self.action_mask_matrix()
        refused = [(i, int(v)) for i, v in enumerate(a) if not mask[i, v]]
        for i, _ in refused:
            a[i] = 1 if i < self.max_stages - 1 else self.micro_batch_set.index(self.micro_batches)
        cuts = bounds(self.sizes).copy()
        S = len(self.sizes)
        cuts[1:S] += a[: S - 1] - 1
        return tuple(int(x) for x in np.diff(cuts)), self.micro_batch_set[int(a[-1])], refused

    def action_mask_matrix(self) -> np.ndarray:
        """(max_stages, max(3, len(micro_batch_set))) booleans: row i < max_stages - 1 the moves of
        boundary i, the last row the micro-batch choices (see the class docstring)."""
        sim, sizes = self.sim, self.sizes
        S, width = len(sizes), max(3, len(self.micro_batch_set))
        mask = np.zeros((self.max_stages, width), dtype=bool)
        mask[: self.max_stages - 1, 1] = True
        reps = [len(w) for w in sim.stage_workers]
        caps = sim.stage_cap_bytes
        m_ok = [
            bool(np.all(stage_memory_bytes(sim.model, sizes, sim.schedule, m, reps) <= caps))
            for m in self.micro_batch_set
        ]
        if not any(m_ok):
            m_ok[self.micro_batch_set.index(self.micro_batches)] = True  # the plan in force stays possible
        mask[-1, : len(self.micro_batch_set)] = m_ok
        m_worst = max(m for m, ok in zip(self.micro_batch_set, m_ok, strict=True) if ok)
        plus = [sizes[i + 1] >= 2 for i in range(S - 1)]  # boundary i +1: stage i + 1 loses its first
        minus = [sizes[i] - (1 if i > 0 and plus[i - 1] else 0) >= 2 for i in range(S - 1)]
        # memory: stage j receives its right neighbour's first block if plus[j], its left's last if minus[j-1]
        gain_right = [j < S - 1 and plus[j] for j in range(S)]
        gain_left = [j > 0 and minus[j - 1] for j in range(S)]
        fits = [self._fits_with(j, gain_left[j], gain_right[j], m_worst) for j in range(S)]
        for i in range(S - 1):
            mask[i, 2] = plus[i] and fits[i]
            mask[i, 0] = minus[i] and fits[i + 1]
        return mask

    def _fits_with(self, stage: int, left: bool, right: bool, m: int) -> bool:
        sim, b = self.sim, bounds(self.sizes)
        lo, hi = b[stage] - int(left), b[stage + 1] + int(right)
        sizes = list(self.sizes)
        sizes[stage] = hi - lo
        flight = (
            m if sim.schedule == "gpipe" else min(len(self.sizes) - stage, m)
        )  # sim.pipeline.schedule.in_flight
        versions = flight if sim.schedule == "async_1f1b" else 1
        reps = len(sim.stage_workers[stage])
        need = (
            versions * sim.model.state_bytes(lo, hi)
            + flight * sim.model.activation_bytes(lo, hi) * sim.model.micro_batch / reps
        )
        return bool(need <= sim.stage_cap_bytes[stage])

    def action_masks(self) -> np.ndarray:
        """Flat masks for ``MaskablePPO``: 3 per boundary, then one per micro-batch choice."""
        if self.sim is None:
            raise RuntimeError("PipelineClusterEnv.action_masks() called before reset()")
        mat = self.action_mask_matrix()
        return np.concatenate(
            [mat[: self.max_stages - 1, :3].reshape(-1), mat[-1, : len(self.micro_batch_set)]]
        )

    def action_for(self, sizes: Sequence[int], micro_batches: int | None = None) -> np.ndarray:
        """The action that moves each boundary one block toward ``sizes`` (a controller's helper)."""
        cur, want = bounds(self.sizes), bounds(tuple(sizes))
        if len(want) != len(cur):
            raise ValueError(f"sizes has {len(want) - 1} stages, the pipeline {len(cur) - 1}")
        a = np.ones(self.max_stages, dtype=np.int64)
        mask = self.action_mask_matrix()
        for i in range(len(cur) - 2):
            step = int(np.sign(want[i + 1] - cur[i + 1])) + 1
            a[i] = step if mask[i, step] else 1
        m = self.micro_batches if micro_batches is None else int(micro_batches)
        a[-1] = self.micro_batch_set.index(m) if mask[-1, self.micro_batch_set.index(m)] else (
            self.micro_batch_set.index(self.micro_batches)
        )  # fmt: skip
        return a

    # --- observation -------------------------------------------------------------------------------
    def _obs(self, r: PipelineReport) -> np.ndarray:
        S, n = r.num_stages, self.sim.model.num_blocks
        per = -np.ones((self.max_stages, len(STAGE_FEATURES)))
        work = r.fwd_time_s + r.bwd_time_s
        mean = max(float(work.mean()), 1e-12)
        link = np.zeros(S)
        link[: S - 1] = r.link_bytes_per_s / 1e6
        per[:S] = np.column_stack(
            [
                np.ones(S),
                _lin(np.asarray(r.sizes) / n, 0.0, 1.0),
                _log10(r.fwd_time_s, -4, 1),
                _log10(r.bwd_time_s, -4, 1),
                _lin(np.log2(np.maximum(work, 1e-12) / mean), -3, 3),
                _log10(r.send_time_s, -5, 0),
                _lin(r.bubble_fraction, 0, 1),
                _lin(r.idle_fraction, 0, 1),
                _lin(r.gpu_util, 0, 1),
                _lin(r.mem_util, 0, 1),
                _log10(link, -1, 4),
            ]
        )
        cuts = -np.ones(self.max_stages - 1)
        cuts[: S - 1] = _lin(bounds(r.sizes)[1:-1] / n, 0, 1)
        wall = max(r.interval_time_s, 1e-12)
        g = [
            _lin(math.log2(r.micro_batches), 0, 7),
            _log10(max(r.iteration_time_s, 1e-3), -3, 2),
            _lin(math.log2(max(r.iteration_time_s, 1e-12) / max(self._first_iteration_s, 1e-12)), -3, 3),
            _lin(r.repartition_time_s / wall, 0, 1),
            _lin(r.stall_time_s / wall, 0, 1),
            _lin(r.val_accuracy, 0, 1),
            _lin(r.val_accuracy / self.target, 0, 1),
            _lin(r.wall_time_s / self.time_budget_s, 0, 1),
            _lin(n, 0, 64),
            _lin(S, 0, self.max_stages),
        ]
        parts = [per.reshape(-1), cuts, np.array(g, dtype=np.float64).reshape(-1)]
        if self.move_gains:
            parts.append(_lin(self.move_gain_values(r), -0.5, 0.5).reshape(-1))
        return np.concatenate(parts).astype(np.float32)

    def quiet_profile(self):
        """The episode's quiet-cluster profile (:func:`~dynamix_gym.pipeline.planner.profile` of the
        backend: what the planners and the move gains read), computed once per episode."""
        if self.sim is None:
            raise RuntimeError("PipelineClusterEnv.quiet_profile() called before reset()")
        if self._profile is None:
            self._profile = profile(self.sim)
        return self._profile

    def move_gain_values(self, r: PipelineReport) -> np.ndarray:
        """(max_stages - 1, 2) raw move gains of the report's partition (the v1 features; -1 where
        the move would empty a stage or the boundary is padding)."""
        prof, S = self.quiet_profile(), r.num_stages
        out = -np.ones((self.max_stages - 1, len(MOVE_FEATURES)))
        if prof.num_stages != S:
            return out
        sizes = tuple(int(x) for x in r.sizes)
        b = bounds(sizes)
        s = np.arange(S)
        quiet = (prof.fwd_cum[s, b[1:]] - prof.fwd_cum[s, b[:-1]]) + (
            prof.bwd_cum[s, b[1:]] - prof.bwd_cum[s, b[:-1]]
        )
        slow = np.clip((r.fwd_time_s + r.bwd_time_s) / np.maximum(quiet, 1e-12), 1e-3, 1e3)
        now = max(plan_cost_s(prof, sizes, slow), 1e-12)
        for i in range(S - 1):
            for k, d in enumerate((-1, 1)):  # -1: stage i hands its last block on; +1: it takes one
                moved = list(sizes)
                moved[i] += d
                moved[i + 1] -= d
                if min(moved[i], moved[i + 1]) >= 1:
                    out[i, k] = 1.0 - plan_cost_s(prof, moved, slow) / now
        return out

    def _info(self, report: PipelineReport) -> dict[str, Any]:
        return {
            "report": report,
            "sizes": self.sizes,
            "micro_batches": self.micro_batches,
        }
