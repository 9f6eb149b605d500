"""Guards that keep a batch-size controller from wrecking a training run: one implementation,
shared by every real path (the DDP backend behind ``dynamix/RealDDP-v0`` and the elastic job, the
``torchrun`` drop-in, the arbitrator's clients) and, later, modelled by the simulator.

Three mechanisms, configured by one :class:`GuardConfig` (``mode="act"``, the default):

1. **A capped learning-rate gain.** The LR rule's multiplier of the base learning rate is capped at
   ``max_lr_gain`` (:func:`capped_lr_gain`). Default 2: the real AdaScale runs on the CPU task lose
   progress beyond twice the base rate (``results/fidelity/schedules_fit.md``: fitted
   ``lr_stable_gain`` 2.0) and diverge in some seeds at 8-16x the base batch.
2. **A learning-rate ramp.** When the learning rate rises because the global batch grew, it moves
   to its new value linearly over ``lr_ramp_iters`` iterations, never in one step (Goyal et al.'s
   gradual warm-up), :class:`LRRamp`; a lower rate is taken at once (a slow descent would keep a
   rate that is already too high, as after a rollback), and so is the rule's drift at a fixed batch. The gain itself follows the gradient noise
   scale's exponential moving average, so it is smoothed as well as capped, and it stays 1 until that
   average rests on an interval after the run's first (``lr_gain_warmup``): the two-batch estimate of
   the first interval after initialisation, while |G|^2 falls fastest, overshoots (on the CNN task
   67 to 10^7 samples against 6-27 in the intervals after, 5 seeds), and the gain it gave at the
   job's batch (1.5-2x, at once, the batch unchanged) dropped the accuracy of 4 of 8 seeds at the next
   interval (0.35 -> 0.12 at worst).
3. **A divergence watchdog with rollback** (:class:`Watchdog`). After every interval it compares the
   validation quality (the report's rising ``val_accuracy``) with its best so far and the validation
   loss with its lowest so far, each as held for ``best_window`` good intervals in a row (a
   one-interval peak early in a run is no best to fall from). An interval is *bad* when the
   quality is more than ``quality_drop`` below its best, or the loss above ``loss_factor`` times
   its lowest, or the loss is not finite;
   ``patience`` bad intervals in a row (a non-finite loss at once) *fire* it. A backend then rolls
   training back to its last good snapshot (model, optimiser, data position, noise-scale estimate,
   the batches and learning rate in force then), and a fallback holds control for ``cooldown``
   intervals: ``"hold"`` keeps the snapshot's batches; a controller name hands the decisions to
   that controller. Each rollback also multiplies the learning rate by ``lr_backoff`` for the rest
   of the run (:attr:`Guard.lr_scale`): a state that was healthy and collapsed again at the same
   batches had too high a rate (AdaScale's gain grows with the noise scale at a fixed batch), and
   rolling back to it unchanged would only repeat the collapse. After ``max_rollbacks`` firings the
   fallback keeps control for the rest of the run. A snapshot is taken after every *good* interval (quality within ``snapshot_tolerance`` of
   its best, loss within its bound), so the state rolled back to is one the watchdog saw healthy.

``mode="watch"`` runs the watchdog and records what it would have done, but changes nothing (the
learning rate is the rule's, applied at once; no snapshot, no rollback): a run is bit-for-bit the
same as with ``mode="off"``.

Every firing is a :class:`GuardEvent`: what fired, the interval, the wall time lost since the
snapshot, and the snapshot's interval and batches; backends list it in the report's ``events`` and
keep the list for the run's summary.

This module is numpy-free and torch-free: the worker processes import it at no cost.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

log = logging.getLogger(__name__)

GUARD_MODES = ("off", "watch", "act")
#: Fallbacks every real path knows without a controller registry.
BUILTIN_FALLBACKS = ("hold",)


class TrainingDiverged(RuntimeError):
    """The training or validation loss became NaN or infinite (raised by a backend)."""


@dataclass(frozen=True)
class GuardConfig:
    """How the guards act; every field is checked (an out-of-range value raises ``ValueError`` naming
    the field and its range).

    Args:
        mode: ``"act"`` (cap, ramp, watchdog with rollback), ``"watch"`` (watchdog only, records what
            it would do, changes nothing) or ``"off"``.
        max_lr_gain: cap on the LR rule's multiplier of the base learning rate, >= 1; ``None``: no cap.
        lr_ramp_iters: iterations over which the learning rate moves to a new value (0: at once).
        lr_gain_warmup: intervals at a run's start whose noise-scale estimates the LR rule leaves out
            (>= 0; 0: none), so that its gain stays 1 through them and the next interval.
        quality_drop: validation quality below its best by more than this (a fraction, (0, 1]) is bad.
        loss_factor: validation loss above this multiple (> 1) of its lowest is bad; ``None``: not watched.
        patience: bad intervals in a row that fire the watchdog (>= 1).
        cooldown: intervals the fallback keeps control after a rollback (>= 0).
        fallback: ``"hold"`` (the snapshot's batches) or a controller name (env and drop-in).
        max_rollbacks: firings after which the fallback keeps control for the rest of the run (>= 1).
        lr_backoff: factor on the learning rate after each rollback, (0, 1] (1: none).
        best_window: the quality's best (and the loss's lowest) is the level it held for this many good
            intervals in a row (>= 1; 1: a single interval's peak), so that the volatile first
            intervals of a run (a peak at 0.5, then 0.1, then on its way) do not fire it.
        snapshot_tolerance: an interval within this much of the best quality (and not bad) is good
            and snapshotted ([0, quality_drop]).
    """

    mode: str = "act"
    max_lr_gain: float | None = 2.0
    lr_ramp_iters: int = 20
    lr_gain_warmup: int = 1
    quality_drop: float = 0.15
    loss_factor: float | None = 3.0
    patience: int = 2
    cooldown: int = 5
    fallback: str = "hold"
    max_rollbacks: int = 3
    snapshot_tolerance: float = 0.05
    lr_backoff: float = 0.5
    best_window: int = 2

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"guards.{name}={getattr(self, name)!r} is outside its range: {allowed}")

        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise bad(name, "a finite number")
            return float(value)

        def whole(name: str, low: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, f"an integer >= {low}")

        if self.mode not in GUARD_MODES:
            raise bad("mode", f"one of {list(GUARD_MODES)}")
        if self.max_lr_gain is not None and number("max_lr_gain") < 1.0:
            raise bad("max_lr_gain", ">= 1 (a multiple of the base learning rate), or null for no cap")
        whole("lr_ramp_iters", 0)
        whole("lr_gain_warmup", 0)
        if not 0.0 < number("quality_drop") <= 1.0:
            raise bad("quality_drop", "(0, 1] (validation quality is a fraction)")
        if self.loss_factor is not None and number("loss_factor") <= 1.0:
            raise bad("loss_factor", "> 1 (a multiple of the lowest validation loss), or null")
        whole("patience", 1)
        whole("cooldown", 0)
        whole("max_rollbacks", 1)
        whole("best_window", 1)
        if not isinstance(self.fallback, str) or not self.fallback:
            raise bad("fallback", "'hold' or a controller name")
        if not 0.0 <= number("snapshot_tolerance") <= self.quality_drop:
            raise bad("snapshot_tolerance", f"[0, quality_drop={self.quality_drop}]")
        if not 0.0 < number("lr_backoff") <= 1.0:
            raise bad("lr_backoff", "(0, 1] (a factor on the learning rate after each rollback)")

    @classmethod
    def from_any(cls, value: GuardConfig | Mapping[str, Any] | str | None) -> GuardConfig:
        """A config from itself, a mapping of fields (Hydra), a mode name, or ``None`` (defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(mode=value)
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"unknown guards settings {unknown}; known: {sorted(known)}")
            return cls(**dict(value))
        raise TypeError(f"guards must be a GuardConfig, a mapping, a mode name or None, got {value!r}")

    @property
    def acts(self) -> bool:
        return self.mode == "act"

    @property
    def watches(self) -> bool:
        return self.mode != "off"

    def lr_gain(self, gain: float) -> float:
        """The LR rule's ``gain`` under this config: capped when acting, else unchanged."""
        return capped_lr_gain(gain, self.max_lr_gain if self.acts else None)

    def ramp_iters(self) -> int:
        return self.lr_ramp_iters if self.acts else 0

    def gain_warmup(self) -> int:
        """Intervals at a run's start whose noise-scale estimates the LR rule leaves out (none unless acting)."""
        return self.lr_gain_warmup if self.acts else 0


def capped_lr_gain(gain: float, max_gain: float | None) -> float:
    """``min(gain, max_gain)`` (``max_gain=None``: ``gain``)."""
    return gain if max_gain is None else min(gain, float(max_gain))


class LRRamp:
    """The learning rate of each iteration: rises linearly from where it is to a higher target over
    ``iters`` iterations (0: at once) when the global batch grew; a lower target is taken at once,
    and so is a higher one at the same batch (the rule's drift with its noise-scale estimate, which
    a ramp restarted at every interval would hold below its target for good). Mid-ramp, a new target
    at the same batch is where the ramp now goes; one at a larger batch starts a new ramp from the
    current rate.

    Every rank of a job holds one and feeds it the same targets, so every rank steps the same rates.
    """

    def __init__(self, iters: int, lr: float | None = None) -> None:
        if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
            raise ValueError(f"lr ramp iters must be an integer >= 0, got {iters!r}")
        self.iters = iters
        self.start = self.target = lr
        self.done = iters  # iterations into the current ramp
        self.last_batch: int | None = None

    def set_target(self, lr: float, global_batch: int | None = None) -> None:
        """The rate to reach; ``global_batch`` (None: treated as grown) tells a jump from a drift."""
        grew = global_batch is None or self.last_batch is None or global_batch > self.last_batch
        if global_batch is not None:
            self.last_batch = int(global_batch)
        if self.target is None or self.iters == 0 or lr <= self.current:
            self.start = self.target = lr
            self.done = self.iters
        elif grew:
            if lr != self.target:
                self.start, self.target, self.done = self.current, lr, 0
        elif self.done < self.iters:
            self.target = lr  # the same ramp, to the drifted target
        else:
            self.start = self.target = lr

    @property
    def current(self) -> float:
        if self.target is None:
            raise RuntimeError("LRRamp has no learning rate yet: call set_target() first")
        if self.done >= self.iters:
            return self.target
        return self.start + (self.target - self.start) * self.done / self.iters

    def next(self) -> float:
        """The rate for the next iteration (then advances the ramp by one iteration)."""
        self.done = min(self.done + 1, self.iters)
        return self.current

    def steps(self, k: int) -> list[float]:
        """The rates of the next ``k`` iterations."""
        return [self.next() for _ in range(k)]

    def state_dict(self) -> dict[str, Any]:
        return {"iters": self.iters, "start": self.start, "target": self.target, "done": self.done,
                "last_batch": self.last_batch}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.iters, self.start, self.target, self.done = (
            int(state["iters"]),
            state["start"],
            state["target"],
            int(state["done"]),
        )
        self.last_batch = state.get("last_batch")


@dataclass(frozen=True)
class GuardEvent:
    """One firing of the watchdog (what a backend did about it is in ``action``)."""

    interval: int  # the interval (0-based, the run's count) whose report fired it
    reason: str
    action: str  # "rolled back" (act) | "would roll back" (watch) | "fallback kept to the end"
    wall_time_s: float  # when it fired
    time_lost_s: float  # wall time since the snapshot rolled back to (act), else 0
    snapshot_interval: int | None  # the interval after which the snapshot was taken
    snapshot_batches: tuple[int, ...] | None
    quality: float  # the firing interval's validation quality
    best_quality: float

    def describe(self) -> str:
        where = (
            f"; back to the snapshot after interval {self.snapshot_interval} at batches "
            f"{list(self.snapshot_batches or ())}, {self.time_lost_s:.1f} s of training lost"
            if self.snapshot_interval is not None and self.action.startswith("rolled back")
            else ""
        )
        return f"guard: {self.reason} at interval {self.interval}: {self.action}{where}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["snapshot_batches"] = list(self.snapshot_batches) if self.snapshot_batches else None
        return out


@dataclass
class Verdict:
    """What the watchdog says of one interval."""

    fire: bool = False
    good: bool = False  # healthy: take a snapshot of this state
    reason: str = ""


@dataclass
class Watchdog:
    """Watches validation quality and loss against their best (:class:`GuardConfig`)."""

    config: GuardConfig
    best_quality: float = field(default=-math.inf, init=False)
    lowest_loss: float = field(default=math.inf, init=False)
    streak: int = field(default=0, init=False)
    recent: list[tuple[float, float]] = field(default_factory=list, init=False)  # the last good intervals

    def reset(self) -> None:
        self.best_quality, self.lowest_loss, self.streak = -math.inf, math.inf, 0
        self.recent = []

    def check(self, quality: float, loss: float) -> Verdict:
        """One interval's validation quality (rising fraction) and loss."""
        cfg = self.config
        if not (math.isfinite(loss) and math.isfinite(quality)):
            self.streak = cfg.patience
            return Verdict(fire=True, reason=f"validation loss {loss} is not finite")
        reasons = []
        if quality < self.best_quality - cfg.quality_drop:
            reasons.append(
                f"validation quality {quality:.4f} fell {self.best_quality - quality:.4f} below its best "
                f"{self.best_quality:.4f} (limit {cfg.quality_drop})"
            )
        if cfg.loss_factor is not None and loss > cfg.loss_factor * self.lowest_loss:
            reasons.append(
                f"validation loss {loss:.4g} rose past {cfg.loss_factor} x its lowest {self.lowest_loss:.4g}"
            )
        if reasons:
            self.streak += 1
            self.recent = []
            fire = self.streak >= cfg.patience
            tail = f" for {self.streak} intervals in a row" if self.streak > 1 else ""
            return Verdict(fire=fire, reason="; ".join(reasons) + tail)
        self.streak = 0
        # the best is a level held for best_window good intervals in a row, not a one-interval peak
        self.recent = [*self.recent, (quality, loss)][-cfg.best_window :]
        if len(self.recent) == cfg.best_window:
            self.best_quality = max(self.best_quality, min(q for q, _ in self.recent))
            self.lowest_loss = min(self.lowest_loss, max(lo for _, lo in self.recent))
        return Verdict(good=quality >= self.best_quality - cfg.snapshot_tolerance)

    def state_dict(self) -> dict[str, Any]:
        return {"best_quality": self.best_quality, "lowest_loss": self.lowest_loss, "streak": self.streak,
                "recent": list(self.recent)}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_quality = float(state["best_quality"])
        self.lowest_loss = float(state["lowest_loss"])
        self.streak = int(state["streak"])
        self.recent = [tuple(x) for x in state.get("recent", [])]


class Guard:
    """The watchdog, the cool-down and the record of firings for one run; the backend (or drop-in)
    that owns it does the snapshots and rollbacks it asks for.

    Per interval the owner calls :meth:`observe` with the interval's quality and loss (or
    ``diverged=`` the error of a non-finite loss). It answers ``"snapshot"`` (the state is good: keep
    it), ``"rollback"`` (restore the last snapshot, then call :meth:`rolled_back`) or ``""``.
    While :attr:`cooling_down`, the fallback decides the batches (:attr:`held_batches` for "hold").
    """

    def __init__(self, config: GuardConfig | Mapping[str, Any] | str | None = None) -> None:
        self.config = GuardConfig.from_any(config)
        self.watchdog = Watchdog(self.config)
        self.reset()

    def reset(self) -> None:
        self.watchdog.reset()
        self.events: list[GuardEvent] = []
        self.cooldown_left = 0
        self.rollbacks = 0
        self.fallback_intervals = 0  # intervals decided by the fallback
        self.snapshot_interval: int | None = None
        self.snapshot_wall_s = 0.0
        self.held_batches: tuple[int, ...] | None = None
        self._snapshot_watch: dict[str, float] | None = None
        self._pending: tuple[int, str, float] | None = None

    # --- what the decision layer reads --------------------------------------------------------------
    @property
    def cooling_down(self) -> bool:
        return self.config.acts and (self.cooldown_left > 0 or self.rollbacks >= self.config.max_rollbacks)

    @property
    def lr_scale(self) -> float:
        """The factor on the learning rate the rollbacks so far leave (``lr_backoff ** rollbacks``)."""
        return self.config.lr_backoff**self.rollbacks if self.config.acts else 1.0

    def fallback_decides(self) -> bool:
        """Whether the fallback decides this interval (counts it)."""
        if not self.cooling_down:
            return False
        self.fallback_intervals += 1
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
        return True

    # --- what the training layer calls --------------------------------------------------------------
    def observe(
        self,
        interval: int,
        wall_time_s: float,
        quality: float,
        loss: float,
        batches: tuple[int, ...] | list[int],
        diverged: str | None = None,
    ) -> str:
        """Judge one interval: ``"snapshot"``, ``"rollback"`` or ``""`` (see the class)."""
        cfg = self.config
        if not cfg.watches:
            return ""
        if diverged is not None:
            verdict = Verdict(fire=True, reason=diverged)
            self.watchdog.streak = cfg.patience
        else:
            verdict = self.watchdog.check(quality, loss)
        if verdict.fire:
            if not cfg.acts:
                self._record(interval, verdict.reason, "would roll back", wall_time_s, quality)
                return ""
            if self.snapshot_interval is None:  # nothing healthy seen yet: nothing to go back to
                self._record(interval, verdict.reason, "no snapshot to roll back to", wall_time_s, quality)
                return ""
            self._pending = (interval, verdict.reason, quality)
            return "rollback"
        if verdict.good and cfg.acts:
            self.snapshot_interval = interval
            self.snapshot_wall_s = wall_time_s
            self.held_batches = tuple(int(b) for b in batches)
            self._snapshot_watch = self.watchdog.state_dict()
            return "snapshot"
        return ""

    def _record(self, interval: int, reason: str, action: str, wall_time_s: float, quality: float) -> None:
        """A firing that rolls nothing back (watch mode, or no snapshot yet)."""
        best = self.watchdog.best_quality
        snap, held = self.snapshot_interval, self.held_batches
        self.events.append(GuardEvent(interval, reason, action, wall_time_s, 0.0, snap, held, quality, best))
        self.watchdog.streak = 0

    def rolled_back(self, wall_time_s: float) -> GuardEvent:
        """Record the rollback the last :meth:`observe` asked for (the owner restored the snapshot)."""
        if self._pending is None:
            raise RuntimeError("Guard.rolled_back() without a rollback asked for")
        interval, reason, quality = self._pending
        self._pending = None
        best = self.watchdog.best_quality
        if self._snapshot_watch is not None:
            self.watchdog.load_state_dict(self._snapshot_watch)
        self.watchdog.streak = 0
        self.rollbacks += 1
        self.cooldown_left = self.config.cooldown
        action = "rolled back"
        if self.rollbacks >= self.config.max_rollbacks:
            action += f"; the fallback keeps control to the end ({self.rollbacks} rollbacks)"
        event = GuardEvent(
            interval,
            reason,
            action,
            wall_time_s,
            max(wall_time_s - self.snapshot_wall_s, 0.0),
            self.snapshot_interval,
            self.held_batches,
            quality,
            best,
        )
        self.events.append(event)
        return event

    def summary(self) -> dict[str, Any]:
        """Counts for a run's summary row."""
        return {
            "guard_mode": self.config.mode,
            "guard_firings": len(self.events),
            "guard_rollbacks": self.rollbacks,
            "guard_time_lost_s": float(sum(e.time_lost_s for e in self.events)),
            "guard_fallback_intervals": self.fallback_intervals,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "watchdog": self.watchdog.state_dict(),
            "events": [e.as_dict() for e in self.events],
            "cooldown_left": self.cooldown_left,
            "rollbacks": self.rollbacks,
            "fallback_intervals": self.fallback_intervals,
            "held_batches": self.held_batches,
            "snapshot_interval": self.snapshot_interval,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue a run resumed from a checkpoint (its in-memory snapshot is gone: none is held)."""
        self.watchdog.load_state_dict(state["watchdog"])
        self.events = [
            GuardEvent(**{**e, "snapshot_batches": tuple(e["snapshot_batches"] or ()) or None})
            for e in state["events"]
        ]
        self.cooldown_left = int(state["cooldown_left"])
        self.rollbacks = int(state["rollbacks"])
        self.fallback_intervals = int(state["fallback_intervals"])
        self.held_batches = tuple(state["held_batches"]) if state["held_batches"] else None
        self.snapshot_interval = None


class GuardedBackend:
    """The guards around a backend's intervals, one implementation for every backend.

    The class it is mixed into provides ``guard`` (a :class:`Guard`), ``_intervals`` (intervals run
    so far), ``wall_time_s()``, ``_interval(batches, k)`` (one interval at checked batches; it may
    raise :class:`TrainingDiverged`), ``_take_snapshot()`` and ``_restore_snapshot()`` (its training
    state kept and put back; the clocks and the faults run on).
    """

    def guarded_interval(self, b: Any, k_iters: int) -> Any:
        """One interval under the guards: the fallback's batches while it holds control, the
        watchdog's verdict after it, a snapshot after a good interval and, when it fires, a rollback
        and the interval run again at the snapshot's batches (its report covers the whole time)."""
        import numpy as np  # the worker processes import this module without numpy's cost

        guard = self.guard
        notes: list[str] = []
        if guard.config.fallback == "hold" and guard.fallback_decides():
            held = np.asarray(guard.held_batches, dtype=np.int64)
            if np.any(held != b):
                notes.append(f"guard: the fallback holds the batches {held.tolist()} (asked {b.tolist()})")
            b = held
        t_start = self.wall_time_s()
        seen = len(guard.events)
        try:
            report, diverged = self._interval(b, k_iters), None
        except TrainingDiverged as e:
            if not guard.config.watches:
                raise
            self._intervals += 1  # the interval ran; its time is spent
            report, diverged = None, str(e)
        quality = report.val_accuracy if report is not None else math.nan
        loss = report.val_loss if report is not None else math.nan
        verdict = guard.observe(self._intervals - 1, self.wall_time_s(), quality, loss, b.tolist(), diverged)
        if verdict == "snapshot":
            self._take_snapshot()
        elif verdict == "rollback":
            report = self._roll_back(k_iters, t_start)
        for event in guard.events[seen:]:
            notes.append(event.describe())
            log.warning("%s", notes[-1])
        if report is None:  # diverged, and nothing to roll back to (or only watching)
            raise TrainingDiverged(f"{diverged} ({notes[-1] if notes else 'guards off'})")
        if notes:
            report = replace(report, events=(*report.events, *notes))
        return report

    def _roll_back(self, k_iters: int, t_start: float) -> Any:
        """Restore the last snapshot, then run the interval again at its batches (the fallback's
        first interval; a second divergence from a good state is raised)."""
        import numpy as np

        self._restore_snapshot()
        self.guard.rolled_back(self.wall_time_s())
        self.guard.fallback_intervals += 1
        held = np.asarray(self.guard.held_batches, dtype=np.int64)
        report = self._interval(held, k_iters)
        quality, loss = report.val_accuracy, report.val_loss
        if (
            self.guard.observe(self._intervals - 1, self.wall_time_s(), quality, loss, held.tolist())
            == "snapshot"
        ):
            self._take_snapshot()
        return replace(report, interval_time_s=self.wall_time_s() - t_start)
