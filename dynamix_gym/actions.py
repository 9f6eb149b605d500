"""Batch actions: the action modes, their spaces and how an action becomes new local batches.

Defined once for everything that turns a policy's action into local batches: the env
(:class:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv`), the torchrun drop-in controller
(which has a :class:`~sim.protocol.BackendSpec` and no env) and deployed bundles (the legal
steps of the discrete modes, :func:`step_masks`). The env's docstring describes the modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from sim.protocol import BackendSpec, IntervalReport

#: every action mode: per-worker steps (``delta``, ``scale``), target batches (``absolute``) or scales
#: in [0.8, 1.2] (``continuous``)
ACTION_MODES = ("delta", "absolute", "continuous", "scale")
#: the discrete modes: one step of ``action_set`` per worker, with the env's ``action_masks``
DISCRETE_ACTION_MODES = ("delta", "scale")
#: delta mode: DYNAMIX's steps, added to a worker's local batch
DEFAULT_ACTION_SET = (-100, -25, 0, 25, 100)
#: scale mode: worker i's local batch becomes round(b_i * factor); the default factors are
#: symmetric in octaves (x1/2 <-> x2, x4/5 <-> x5/4) and keep 1 (no change), which is never masked.
DEFAULT_SCALE_SET = (0.5, 0.8, 1.0, 1.25, 2.0)
#: continuous mode: action a in [-1, 1] scales each local batch by 1 + CONTINUOUS_SCALE * a.
CONTINUOUS_SCALE = 0.2
#: What happens to the batches an action asks for: ``policy`` runs them as they are (DYNAMIX's
#: per-worker decisions); ``balanced`` keeps their sum over the live workers (the policy's global
#: batch) and splits it in proportion to each worker's measured throughput (:func:`balanced_split`);
#: ``balanced_cost`` does the same but keeps the batches in force when the global batch barely moves
#: and the re-split would not win back its measured reconfiguration pause within one interval.
SPLIT_MODES = ("policy", "balanced", "balanced_cost")
#: the split modes that re-split the global batch by measured throughput
BALANCED_SPLITS = ("balanced", "balanced_cost")
#: balanced split: the largest relative move of any worker's batch not worth a reconfiguration
#: (Cannikin's tolerance, results/baselines/TUNING.md).
DEFAULT_SPLIT_TOLERANCE = 0.1


def action_space(action_mode: str, action_set: np.ndarray, spec: BackendSpec) -> spaces.Space:
    """The action space of ``action_mode`` over ``spec``'s workers (discrete modes: one step of
    ``action_set`` per worker; ``absolute``: the workers' batch ranges; ``continuous``: [-1, 1])."""
    n = spec.num_workers
    if action_mode in DISCRETE_ACTION_MODES:
        return spaces.MultiDiscrete(np.full(n, action_set.size, dtype=np.int64))
    if action_mode == "absolute":
        lo = spec.min_batch.astype(np.float32)
        hi = spec.max_batch.astype(np.float32)
        return spaces.Box(lo, hi, (n,), np.float32)
    return spaces.Box(-1.0, 1.0, (n,), np.float32)


def apply_action(
    action,
    action_mode: str,
    action_set: np.ndarray,
    space: spaces.Space,
    batches: np.ndarray,
    spec: BackendSpec,
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """New local batches for ``action`` (in ``space``) from the ``batches`` in force, kept within
    ``spec``'s ranges, and the list of those clippings (``{"worker", "requested", "applied"}``).

    Raises:
        ValueError: for an action of the wrong shape or outside ``space``.
    """
    a = np.asarray(action)
    n = spec.num_workers
    if a.shape != (n,):
        raise ValueError(f"action must have shape ({n},) (one entry per worker), got shape {a.shape}")
    # Range checks through Python lists: cheaper than numpy reductions on a few workers.
    kind = a.dtype.kind
    values = a.tolist()
    if action_mode in DISCRETE_ACTION_MODES:
        whole = kind in "iu" or (kind == "f" and all(math.isfinite(v) and v == int(v) for v in values))
        ok = whole and min(values) >= 0 and max(values) < action_set.size
    else:
        ok = kind in "iuf" and bool((a >= space.low).all() and (a <= space.high).all())
    if not ok:
        raise ValueError(f"action {a.tolist()} is outside the action space {space}")
    if action_mode == "delta":
        requested = batches + action_set[a.astype(np.int64, copy=False)]
    elif action_mode == "scale":
        requested = np.rint(batches * action_set[a.astype(np.int64, copy=False)]).astype(np.int64)
    elif action_mode == "absolute":
        requested = np.rint(a.astype(np.float64)).astype(np.int64)
    else:
        requested = np.rint(batches * (1.0 + CONTINUOUS_SCALE * a.astype(np.float64))).astype(np.int64)
    applied = np.minimum(np.maximum(requested, spec.min_batch), spec.max_batch)
    req_list, app_list = requested.tolist(), applied.tolist()
    clipped = []
    if req_list != app_list:
        clipped = [
            {"worker": i, "requested": r, "applied": p}
            for i, (r, p) in enumerate(zip(req_list, app_list, strict=True))
            if r != p
        ]
    return applied, clipped


def check_split(split: str, tolerance: float = DEFAULT_SPLIT_TOLERANCE) -> tuple[str, float]:
    """``(split, tolerance)`` checked: a mode of :data:`SPLIT_MODES` and a tolerance in [0, 1)."""
    if split not in SPLIT_MODES:
        raise ValueError(f"unknown split {split!r}; choose one of {list(SPLIT_MODES)}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0.0 <= tolerance < 1.0:
        raise ValueError(f"split_tolerance must be a number in [0, 1), got {tolerance!r}")
    return split, float(tolerance)


def observed_reconfig_s(previous: float | None, report: IntervalReport | None) -> float | None:
    """The latest measured reconfiguration pause: ``report``'s when its interval paid one (> 0),
    else ``previous`` (``None`` until a change has been measured)."""
    if report is not None and float(report.reconfig_time_s) > 0.0:
        return float(report.reconfig_time_s)
    return previous


def balanced_split(
    requested: np.ndarray,
    current: np.ndarray,
    report: IntervalReport,
    spec: BackendSpec,
    tolerance: float = DEFAULT_SPLIT_TOLERANCE,
    reconfig_s: float | None = None,
) -> np.ndarray:
    """The ``balanced`` split: the global batch of ``requested`` over the live workers, shared in
    proportion to the throughput each showed in ``report`` (samples/s of compute), within their
    ranges; dead workers keep their batch. Measured data only, so it runs alike on every backend.

    Equal shares of throughput mean equal compute times when times are proportional to the batch,
    and equal times are its fixed point otherwise (a worker that took longer gets less next time),
    so that repeated splits water-fill towards the equal-time split (DLB's rule). If no worker's
    batch would move by more than ``tolerance`` (relative) from ``current`` (the batches in force),
    ``current`` is kept: every change costs a reconfiguration pause.

    With ``reconfig_s`` (the last measured pause; the ``balanced_cost`` split), a re-split that
    leaves the global batch within ``tolerance`` of the one in force is made only if it pays: the
    compute time it saves per iteration at the measured speeds (slowest worker now minus slowest
    worker after), times the interval's iterations, must exceed ``reconfig_s``. Where iterations
    are dominated by a fixed cost (short intervals of a small model) a small re-split no longer
    buys a pause that is a third of the interval.
    """
    from dynamix_gym.controllers.split import fill_to_total, round_to_total

    alive = np.asarray(report.alive, dtype=bool) & (np.asarray(report.compute_time_s) > 0)
    if alive.sum() < 2:
        return requested
    speed = np.asarray(report.local_batch, dtype=np.float64)[alive] / np.asarray(report.compute_time_s)[alive]
    lo, hi = spec.min_batch[alive], spec.max_batch[alive]
    total = int(np.clip(requested[alive].sum(), lo.sum(), hi.sum()))
    target = np.array(requested, dtype=np.int64, copy=True)
    target[alive] = round_to_total(fill_to_total(speed, total, lo, hi), total, lo, hi)
    if np.max(np.abs(target - current) / np.maximum(current, 1)) <= tolerance:
        return np.array(current, dtype=np.int64, copy=True)
    if reconfig_s is not None:
        held = int(np.asarray(current)[alive].sum())
        if abs(target[alive].sum() - held) <= tolerance * max(held, 1):
            now = float(np.max(np.asarray(current, dtype=np.float64)[alive] / speed))
            after = float(np.max(target[alive] / speed))
            if (now - after) * float(np.max(np.asarray(report.iterations))) < reconfig_s:
                return np.array(current, dtype=np.int64, copy=True)
    return target


def split_batches(
    split: str,
    requested: np.ndarray,
    current: np.ndarray,
    report: IntervalReport | None,
    spec: BackendSpec,
    tolerance: float = DEFAULT_SPLIT_TOLERANCE,
    reconfig_s: float | None = None,
) -> np.ndarray:
    """The batches ``split`` makes of ``requested`` (:data:`SPLIT_MODES`): as asked (``policy``),
    or :func:`balanced_split` over ``report``, with the last measured pause ``reconfig_s`` for
    ``balanced_cost`` only. The env, the arbitrator and the drop-in share this one rule."""
    if split not in BALANCED_SPLITS:
        return requested
    if report is None:
        raise ValueError("a balanced split needs the last interval's report")
    paid = reconfig_s if split == "balanced_cost" else None
    return balanced_split(requested, current, report, spec, tolerance, paid)


@dataclass(frozen=True)
class ActionRule:
    """An action mode with its steps and space over a spec's workers: what a controller outside an
    env (the torchrun drop-in, an arbitrator session) needs to turn actions into batches as the env
    does."""

    mode: str
    steps: np.ndarray  # the mode's action set (deltas or factors)
    space: spaces.Space
    split: str = "policy"  # SPLIT_MODES
    split_tolerance: float = DEFAULT_SPLIT_TOLERANCE

    @classmethod
    def for_spec(
        cls,
        mode: str,
        spec: BackendSpec,
        action_set: Sequence[float] | None = None,
        split: str = "policy",
        split_tolerance: float = DEFAULT_SPLIT_TOLERANCE,
    ) -> ActionRule:
        """The rule of ``mode`` (its default steps unless ``action_set``) over ``spec``'s workers."""
        if mode not in ACTION_MODES:
            raise ValueError(f"unknown action_mode {mode!r}; choose one of {list(ACTION_MODES)}")
        steps = check_action_set(mode, action_set)
        split, split_tolerance = check_split(split, split_tolerance)
        return cls(mode, steps, action_space(mode, steps, spec), split, split_tolerance)

    def apply(
        self,
        action,
        batches: np.ndarray,
        spec: BackendSpec,
        report: IntervalReport | None = None,
        reconfig_s: float | None = None,
    ) -> tuple[np.ndarray, list[dict[str, int]]]:
        """New batches from ``batches`` (those in force) and the clippings: :func:`apply_action`,
        then, with a balanced split, :func:`balanced_split` over ``report`` (the last interval's
        measurements, required then); ``reconfig_s`` (the last measured reconfiguration pause, see
        :func:`observed_reconfig_s`) is used by ``balanced_cost`` only."""
        new, clipped = apply_action(action, self.mode, self.steps, self.space, batches, spec)
        new = split_batches(self.split, new, batches, report, spec, self.split_tolerance, reconfig_s)
        return new, clipped


def step_masks(
    action_mode: str,
    action_set: np.ndarray,
    batches: np.ndarray,
    min_batch: np.ndarray,
    max_batch: np.ndarray,
) -> np.ndarray:
    """(N, len(action_set)) bool: which steps of a discrete mode keep each worker's batch in range.

    ``delta``: b_i + d_j; ``scale``: round(b_i * f_j); legal when min_i <= new <= max_i. The env's
    :meth:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv.action_mask_matrix` and a deployed
    controller (which knows only the batches in force and the backend's spec) share this one rule.
    """
    b = np.asarray(batches, dtype=np.int64)[:, None]
    steps = np.asarray(action_set)[None, :]
    candidate = b + steps if action_mode == "delta" else np.rint(b * steps)
    return (candidate >= np.asarray(min_batch)[:, None]) & (candidate <= np.asarray(max_batch)[:, None])


def check_action_set(action_mode: str, action_set: Sequence[float] | None) -> np.ndarray:
    """The action set of a mode as an array (deltas: int64; factors: float64), or a ValueError."""
    if action_mode == "scale":
        values = list(DEFAULT_SCALE_SET if action_set is None else action_set)
        try:
            factors = np.array([float(a) for a in values], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"action_set (scale factors) must be numbers, got {values!r}") from None
        if factors.size < 2 or len(set(factors.tolist())) != factors.size:
            raise ValueError(f"action_set needs at least two distinct scale factors, got {values}")
        if not np.all(np.isfinite(factors) & (factors > 0.0)):
            raise ValueError(f"action_set (scale factors) must be finite and > 0, got {values}")
        if 1.0 not in factors.tolist():
            raise ValueError(
                f"action_set (scale factors) must contain 1 (keep the batch), so that a worker always has "
                f"a legal step; got {values}"
            )
        return factors
    values = list(DEFAULT_ACTION_SET if action_set is None else action_set)
    deltas = np.array([int(a) for a in values], dtype=np.int64)
    if deltas.size < 2 or len(set(deltas.tolist())) != deltas.size:
        raise ValueError(f"action_set needs at least two distinct deltas, got {values}")
    return deltas


def check_in_range(batches: np.ndarray, spec: BackendSpec, field: str) -> np.ndarray:
    """``batches`` (one whole local batch per worker) as int64 if each lies in its worker's
    [min_batch, max_batch]; else a ValueError naming ``field[i]``, the value and that range."""
    b = np.asarray(batches).astype(np.int64)
    bad = np.flatnonzero((b < spec.min_batch) | (b > spec.max_batch))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{field}[{i}] = {int(b[i])} is outside worker {i}'s range "
            f"[{int(spec.min_batch[i])}, {int(spec.max_batch[i])}]"
        )
    return b
