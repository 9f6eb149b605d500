"""Calibrate right before the run: ``python -m experiments.deploy calibrate.quick=true``.

Before the episode, on the very ranks the deploy then trains with (its
:class:`~adapters.ddp_backend.DDPBackend`: native ranks of one type, ``backend.emulate=null``):

1. **ladder**: a quick step-time ladder (:func:`dynamix_gym.measurement.profiling.profile_ladder`)
   within a wall-time cap (``calibrate.max_s``, default 60 s, the ranks' start included): no ladder
   point starts unless the time it is expected to take fits in what is left, so the ladder ends
   within the cap, or over it by no more than one point's misestimate;
2. **refit**: the stored profile (``calibrate.profile``; default: the PPO bundle's training profile)
   copied to ``<run dir>/profile_refit`` with its compute model refitted, knee included, on the
   slowest rank's compute per iteration
   (:func:`experiments.calibration.fit.refit_compute_knee`, as ``experiments.fit_schedules`` refits
   same-day step times), then its one-node all-reduce (latency and overlap) on the measured step
   times against that compute model (:func:`experiments.calibration.fit.refit_comm_intra_file`;
   the per-replica and inter-node terms stay, one replica count on one node cannot tell them);
3. **overheads**: a few decision intervals of ``K`` iterations on the same ranks, the batches held
   and then changed (``calibrate.overhead_batches``, ``calibrate.overhead_intervals``, at most
   ``calibrate.overhead_max_s``), split into their iterations and the rest
   (:func:`dynamix_gym.measurement.profiling.measure_overheads`, as ``experiments.calibrate`` measures
   them): the refit's ``interval_overhead_s`` and ``reconfig_delay_s`` are this machine's now, not the
   stored profile's (measured on another day, under another load); ``overhead_intervals=0`` keeps
   the stored pair, as does a measurement that saw no interval with unchanged batches;
4. **check**: the stored profile's step times against the measured ones
   (:func:`sim.fitting.step_time.measured_drift`; the refit's own error beside them). Beyond
   ``calibrate.max_drift`` (default 10%) the deploy is refused (:class:`ProfileDriftError`, naming
   the drift and the override) unless ``calibrate.refuse=false``, when it warns and runs. The
   overheads' change is reported, not checked: they are per-interval constants the refit replaces.

``calibration_quick.json`` (every figure) and ``calibration_quick.md`` (the table of what was
measured) are written beside the run's timeline, the refusal included. The episode then starts from
a fresh model on the same ranks (the backend's ``reset``); a resumed run (``backend.resume=true``)
is not calibrated again.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path
from tqdm.auto import tqdm

from dynamix_gym.configs import settings
from experiments.calibration.fit import refit_comm_intra_file, refit_compute_knee
from experiments.common import REPO_ROOT, atomic_write_text, shown
from experiments.reports.markdown import table
from sim.datafiles import dump_json
from sim.fitting.step_time import measured_drift
from sim.profile import PROFILE_FILE, ClusterProfile, load_profile

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.deploy calibrate.quick=true"
REFIT_DIR = "profile_refit"
RECORD_FILE = "calibration_quick.json"
REPORT_FILE = "calibration_quick.md"
#: Bounds of the settings (a quick ladder: a longer one is ``experiments.calibrate``'s job).
MAX_CAP_S = 600.0
MIN_POINTS = 3  # the knee fit needs three batches
MAX_DRIFT = 10.0  # a tolerance beyond 10x is no check: calibrate.refuse=false says so plainly


class ProfileDriftError(RuntimeError):
    """The stored profile's step times are off from this machine's now by more than allowed."""


@dataclass(frozen=True)
class QuickCalibration:
    """``calibrate`` in ``conf/deploy.yaml``; every field is checked with its range."""

    quick: bool = False
    profile: str | None = None
    max_s: float = 60.0
    batches: tuple[int, ...] = (16, 32, 64, 128, 160, 192, 224, 256, 320)
    iterations: int = 10
    repeats: int = 2
    warmup_iterations: int = 3
    max_drift: float = 0.10
    refuse: bool = True
    progress: bool = True
    overhead_intervals: int = 8
    overhead_batches: tuple[int, ...] = (32, 64)
    overhead_max_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("quick", "refuse", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"calibrate.{name} must be true or false, got {getattr(self, name)!r}")
        _number("max_s", self.max_s, 0.0, MAX_CAP_S, "seconds")
        _number("max_drift", self.max_drift, 0.0, MAX_DRIFT, "(a fraction: 0.10 is 10%)")
        _number("overhead_max_s", self.overhead_max_s, 0.0, MAX_CAP_S, "seconds")
        for name, low, high in (
            ("iterations", 1, 1000),
            ("repeats", 1, 20),
            ("warmup_iterations", 1, 1000),
            ("overhead_intervals", 0, 200),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"calibrate.{name} must be an integer in [{low}, {high}], got {value!r}")
        bad = [b for b in self.batches if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if len(set(self.batches)) < MIN_POINTS or bad:
            raise ValueError(
                f"calibrate.batches must list at least {MIN_POINTS} distinct local batches >= 1 (the knee fit "
                f"needs {MIN_POINTS}), got {list(self.batches)}"
            )
        odd = [b for b in self.overhead_batches if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if len(set(self.overhead_batches)) < 2 or odd:
            raise ValueError(
                "calibrate.overhead_batches must list at least 2 distinct local batches >= 1 (held, then changed: "
                f"the reconfiguration delay is the difference), got {list(self.overhead_batches)}"
            )

    @classmethod
    def from_config(cls, node: Any) -> QuickCalibration:
        """From the ``calibrate`` config node (``None``: the defaults, calibration off)."""
        return settings(cls, node, "calibrate", sequences=("batches", "overhead_batches"))


def _number(name: str, value: Any, low: float, high: float, unit: str) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or not low < value <= high:
        raise ValueError(f"calibrate.{name} must lie in ({low:g}, {high:g}] {unit}, got {value!r}")


def stored_profile(settings: QuickCalibration, controller: Any) -> ClusterProfile:
    """``calibrate.profile``, else the profile the controller's PPO bundle was trained on (its
    ``domain.profile``); a relative path is taken from the launch directory, then the repository."""
    ref = settings.profile
    source = "calibrate.profile"
    if not ref:
        bundle = getattr(controller, "bundle", None)
        ref = ((getattr(getattr(bundle, "meta", None), "config", None) or {}).get("domain") or {}).get(
            "profile"
        )
        source = f"the training profile of the bundle {getattr(bundle, 'path', '')}"
    if not ref:
        raise ValueError(
            "calibrate.quick=true checks the run against a stored profile: give calibrate.profile=<profile dir> "
            "(written by python -m experiments.calibrate); this controller names none"
        )
    for candidate in (Path(to_absolute_path(str(ref))), REPO_ROOT / str(ref)):
        if (candidate / PROFILE_FILE).is_file():
            return load_profile(candidate)
    try:
        return load_profile(str(ref))
    except FileNotFoundError as e:
        raise ValueError(f"{source}: {e}") from None


@contextmanager
def measuring(backend: Any) -> Iterator[None]:
    """The ladder is a measurement, not training: no checkpoint of its intervals (a crash before
    the run's first checkpoint must not resume from one; the coordinator decides when to save, the
    ranks never do alone) and no guards (a rollback or a snapshot inside a ladder point is time
    that is not the step's; :mod:`sim.guards`). Both come back for the run."""
    from sim.guards import Guard

    config, guard = backend.config, getattr(backend, "guard", None)
    backend.config = replace(config, checkpoint_every=0)
    if guard is not None:
        backend.guard = Guard("off")
    try:
        yield
    finally:
        backend.config = config
        if guard is not None:
            backend.guard = guard


def check_ranks(backend: Any, stored: ClusterProfile) -> tuple[str, str]:
    """The worker type and application to refit; an error naming what to change when the ranks
    are emulated or the stored profile has no compute model of their type."""
    emulate = getattr(backend.config, "emulate", None)
    if emulate:
        raise ValueError(
            f"calibrate.quick measures native ranks, and this deploy's ranks emulate {list(emulate)} "
            "(backend.emulate=cluster): set backend.emulate=null (and backend.workers=N), or calibrate.quick=false"
        )
    gpu, app = backend.spec.gpu_types[0], stored.workload.app
    if (gpu, app) not in stored.compute:
        raise ValueError(
            f"calibrate.profile {stored.name!r} ({shown(stored.path)}) has no compute model of ({gpu}, {app}) "
            f"(it has {sorted(stored.compute)}): it was not measured on ranks like these"
        )
    return gpu, app


def quick_calibrate(
    backend: Any, stored: ClusterProfile, settings: QuickCalibration, out: Path, seed: int, *, interval: int
) -> dict[str, Any] | None:
    """Ladder, refit, overheads and drift check (see the module docstring) on ``backend``'s ranks,
    decision intervals of ``interval`` (K) iterations; returns the record written to
    ``out / calibration_quick.json`` (``None``: a resumed run, not calibrated).

    Raises:
        ProfileDriftError: the drift exceeds ``settings.max_drift`` and ``settings.refuse``.
        ValueError: emulated ranks, a profile without their model, or too few batches measured.
    """
    from dynamix_gym.measurement.profiling import profile_ladder

    if backend.config.resume:
        log.warning(
            "calibrate.quick: backend.resume=true continues a run under way; it is not calibrated again"
        )
        return None
    gpu, app = check_ranks(backend, stored)
    n = backend.spec.num_workers
    out.mkdir(parents=True, exist_ok=True)
    stages = tqdm(total=4, desc="quick calibration", unit="stage", disable=not settings.progress)
    stages.set_postfix_str(f"ladder on {n} {gpu} ranks, at most {settings.max_s:.0f} s")
    with measuring(backend):
        ladder = profile_ladder(
            {n: backend},
            list(settings.batches),
            iterations=settings.iterations,
            repeats=settings.repeats,
            warmup_iterations=settings.warmup_iterations,
            budget_s=settings.max_s,
            seed=seed,
            progress=settings.progress,
        )
    stages.update(1)
    points = sorted(ladder.points, key=lambda p: p["local_batch"])
    if len(points) < MIN_POINTS:
        stages.close()
        raise ValueError(
            f"the quick ladder measured {len(points)} local batch(es) within calibrate.max_s={settings.max_s:g} s "
            f"({ladder.message()}); the refit needs {MIN_POINTS}: raise calibrate.max_s or drop the largest "
            "calibrate.batches"
        )
    batches = [int(p["local_batch"]) for p in points]
    slowest = [max(p["compute_time_s"]) for p in points]  # what each iteration waits for
    stages.set_postfix_str("refit (knee included)")
    refit_dir = out / REFIT_DIR
    if refit_dir.exists():
        shutil.rmtree(refit_dir)
    # the stored profile's models and settings; its own calibration record and ladder stay with it
    shutil.copytree(
        stored.path, refit_dir, ignore=shutil.ignore_patterns("calibration.*", "*ladder*", "measurements.csv")
    )
    refit = refit_compute_knee(
        refit_dir, batches, slowest, f"{COMMAND} (quick ladder on the deploy's ranks)", gpu, app
    )
    measured_steps = [float(p["step_time_s"]) for p in points]
    comm_refit = (
        refit_comm_intra_file(
            refit_dir, batches, measured_steps, n, f"{COMMAND} (quick ladder on the deploy's ranks)", gpu, app
        )
        if n > 1
        else None
    )
    _note_refit(refit_dir, stored, ladder)
    stages.update(1)
    stages.set_postfix_str(f"overheads: {settings.overhead_intervals} intervals of K={interval}")
    with measuring(backend):
        overheads = remeasure_overheads(backend, stored, settings, refit_dir, interval, seed)
    refitted = load_profile(refit_dir)
    if hasattr(backend, "use_compute_profile"):  # the compute curve schema 4 reads, measured right now
        backend.use_compute_profile(refit_dir)
    stages.update(1)
    stages.set_postfix_str("drift check")
    before = measured_drift(
        (stored.compute_params(gpu, app), stored.comm_params(gpu, app)), batches, measured_steps, n
    )
    after = measured_drift(
        (refitted.compute_params(gpu, app), refitted.comm_params(gpu, app)), batches, measured_steps, n
    )
    drift = {
        "rows": [
            {
                "local_batch": s["local_batch"],
                "measured_s": s["measured_s"],
                "stored_s": s["model_s"],
                "refit_s": r["model_s"],
                "drift": s["drift"],
                "refit_error": r["drift"],
            }
            for s, r in zip(before["rows"], after["rows"], strict=True)
        ],
        "max_drift": before["max_drift"],
        "worst_batch": before["worst_batch"],
        "refit_max_error": after["max_drift"],
    }
    over = drift["max_drift"] > settings.max_drift
    verdict = (
        "refused" if over and settings.refuse else ("over tolerance, deployed anyway" if over else "accepted")
    )
    record = {
        "stored_profile": shown(stored.path),
        "refit_profile": shown(refit_dir),
        "ranks": {"workers": n, "gpu": gpu, "app": app},
        "ladder": {
            "message": ladder.message(),
            "elapsed_s": ladder.elapsed_s,
            "cap_s": settings.max_s,
            "stopped_early": ladder.stopped_early,
            "skipped": ladder.skipped,
            "points": points,
        },
        "measured": [
            {"local_batch": b, "step_time_s": p["step_time_s"], "slowest_compute_s": c}
            for b, p, c in zip(batches, points, slowest, strict=True)
        ],
        "refit": refit,
        "comm_refit": comm_refit,
        "overheads": overheads,
        "drift": drift,
        "max_drift": settings.max_drift,
        "verdict": verdict,
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(out / RECORD_FILE, dump_json(record))
    lines = report_lines(record)
    atomic_write_text(out / REPORT_FILE, "\n".join(lines) + "\n")
    stages.update(1)
    stages.close()
    log.info("quick calibration (%s):\n%s", shown(out / REPORT_FILE), "\n".join(lines))
    if over:
        message = drift_message(record)
        if settings.refuse:
            raise ProfileDriftError(message)
        log.warning("%s (calibrate.refuse=false: deploying anyway)", message)
    return record


def remeasure_overheads(
    backend: Any,
    stored: ClusterProfile,
    settings: QuickCalibration,
    refit_dir: Path,
    interval: int,
    seed: int,
) -> dict[str, Any]:
    """Step 3 of the module docstring: measure the per-interval overheads on ``backend`` (an env of
    ``interval`` iterations per step over it, as an episode pays them) and write them into the
    refit's ``simulator`` settings; the record says what was measured and what was kept."""
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.measurement.profiling import measure_env_overheads, overhead_schedule

    before = {k: float(stored.simulator.get(k, 0.0)) for k in ("interval_overhead_s", "reconfig_delay_s")}
    rec: dict[str, Any] = {"stored": before, "kept": "stored", "measured": None, "samples": []}
    if settings.overhead_intervals == 0:
        rec["reason"] = "calibrate.overhead_intervals=0"
        return rec
    env = HeteroClusterEnv(backend=backend, action_mode="absolute", interval=interval, reward="time")
    # held two intervals each: after the first, every other interval is steady, the others changed
    schedule = overhead_schedule(
        settings.overhead_batches, settings.overhead_intervals, 2, backend.spec.num_workers
    )
    started = time.perf_counter()
    try:
        measured, ended = measure_env_overheads(
            env, schedule, seed=seed, progress=settings.progress, budget_s=settings.overhead_max_s
        )
    except ValueError as e:  # no interval kept its batches: nothing to take the base from
        rec["reason"] = str(e)
        log.warning("calibrate: the overheads were not measured (%s); the stored ones are kept", e)
        return rec
    rec.update(
        kept="measured",
        measured={
            "interval_overhead_s": measured.interval_overhead_s,
            "reconfig_delay_s": measured.reconfig_delay_s,
        },
        samples=[[bool(c), float(o)] for c, o in measured.samples],
        elapsed_s=time.perf_counter() - started,
        episode_ended=ended,
        interval=interval,
    )
    path = refit_dir / PROFILE_FILE
    doc = json.loads(path.read_text())
    doc.setdefault("simulator", {}).update(rec["measured"])
    atomic_write_text(path, dump_json(doc))
    return rec


def _note_refit(refit_dir: Path, stored: ClusterProfile, ladder: Any) -> None:
    """The refit's provenance in its ``profile.json`` (the stored profile's stays beside it)."""
    path = refit_dir / PROFILE_FILE
    doc = json.loads(path.read_text())
    doc["quick_refit"] = {
        "command": COMMAND,
        "from_profile": shown(stored.path),
        "ladder": ladder.message(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(path, dump_json(doc))


def drift_message(record: dict[str, Any]) -> str:
    """The refusal: the measured drift, where, the tolerance, and what to do."""
    drift, tol = record["drift"], float(record["max_drift"])
    worst = next(r for r in drift["rows"] if r["local_batch"] == drift["worst_batch"])
    suggest = math.ceil(100 * drift["max_drift"] + 1) / 100
    override = (
        f"calibrate.max_drift={suggest:g} or calibrate.refuse=false"
        if suggest <= MAX_DRIFT
        else "calibrate.refuse=false"
    )
    return (
        f"quick calibration: the stored profile {record['stored_profile']} predicts step times {worst['drift']:+.1%} "
        f"off this machine's now at local batch {worst['local_batch']} ({1e3 * worst['stored_s']:.2f} ms stored, "
        f"{1e3 * worst['measured_s']:.2f} ms measured on the deploy's ranks); the largest drift allowed is "
        f"calibrate.max_drift={tol:g} ({tol:.0%}). The refitted profile is {record['refit_profile']}: train or "
        f"fine-tune the policy on it, or recalibrate (python -m experiments.calibrate); to deploy anyway set {override}"
    )


def report_lines(record: dict[str, Any]) -> list[str]:
    """What was measured, refitted and checked, as markdown."""
    after = record["refit"]["after"]
    knee = after.get("knee_batch")
    by_batch = {r["local_batch"]: r for r in record["drift"]["rows"]}
    rows = [
        [
            m["local_batch"],
            f"{1e3 * m['step_time_s']:.2f}",
            f"{1e3 * m['slowest_compute_s']:.2f}",
            f"{1e3 * by_batch[m['local_batch']]['stored_s']:.2f}",
            f"{1e3 * by_batch[m['local_batch']]['refit_s']:.2f}",
            f"{by_batch[m['local_batch']]['drift']:+.1%}",
            f"{by_batch[m['local_batch']]['refit_error']:+.1%}",
        ]
        for m in record["measured"]
    ]
    r = record["ranks"]
    return [
        f"# Quick calibration before the deploy ({record['measured_utc']})",
        "",
        f"- ranks: {r['workers']} x {r['gpu']}, workload {r['app']}; ladder: {record['ladder']['message']}",
        f"- stored profile: {record['stored_profile']}; refitted: {record['refit_profile']}",
        f"- refitted compute: alpha {1e3 * after['alpha_s']:.3f} ms + beta {1e3 * after['beta_s']:.4f} ms/sample"
        + (
            f" + {1e3 * after['knee_beta_s']:.4f} ms/sample past local batch {knee:g} (knee)"
            if knee is not None
            else " (no knee kept)"
        ),
        comm_line(record.get("comm_refit")),
        overhead_line(record.get("overheads")),
        f"- step-time drift of the stored profile from the measured: {record['drift']['max_drift']:.1%} at most "
        f"(local batch {record['drift']['worst_batch']}); allowed {float(record['max_drift']):.0%}: {record['verdict']}; "
        f"the refit's error: {record['drift']['refit_max_error']:.1%} at most",
        "",
        *table(
            [
                "local batch",
                "measured step (ms)",
                "slowest compute (ms)",
                "stored step (ms)",
                "refit step (ms)",
                "stored drift",
                "refit error",
            ],
            rows,
            align="rrrrrrr",
        ),
    ]


def overhead_line(rec: dict[str, Any] | None) -> str:
    """The per-interval overheads in one line (``None``: a record from before they were measured)."""
    if rec is None:
        return "- per-interval overheads: the stored profile's (not measured)"
    b = rec["stored"]
    if rec["kept"] != "measured":
        return (
            f"- per-interval overheads: the stored profile's kept ({1e3 * b['interval_overhead_s']:.1f} ms, "
            f"reconfiguration {1e3 * b['reconfig_delay_s']:.1f} ms): {rec.get('reason', 'not measured')}"
        )
    a, n = rec["measured"], len(rec["samples"])
    return (
        f"- per-interval overheads, measured over {n} interval(s) of K={rec['interval']} "
        f"({rec['elapsed_s']:.0f} s): {1e3 * b['interval_overhead_s']:.1f} -> {1e3 * a['interval_overhead_s']:.1f} ms, "
        f"reconfiguration {1e3 * b['reconfig_delay_s']:.1f} -> {1e3 * a['reconfig_delay_s']:.1f} ms"
    )


def comm_line(comm: dict[str, Any] | None) -> str:
    """The all-reduce refit in one line (``None``: one rank, nothing to refit)."""
    if comm is None:
        return "- all-reduce: one rank, none to refit"
    b, a, fit = comm["before"], comm["after"], comm["fit"]
    what = (
        "kept as stored (the refit fitted the ladder no better)"
        if fit["kept_stored"]
        else (
            f"latency {1e3 * b['alpha_intra_s']:.2f} -> {1e3 * a['alpha_intra_s']:.2f} ms, "
            f"overlap gamma {b['gamma']:.2f} -> {a['gamma']:.2f}"
        )
    )
    return (
        f"- refitted all-reduce (one node): {what}; step-time MAPE on the ladder with the refitted compute "
        f"{fit['mape_before']:.1%} -> {fit['mape_after']:.1%}"
    )
