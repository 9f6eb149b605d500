"""Online fine-tuning (DYNAMIX's online mode): PPO from the experience of the jobs the service serves.

The service hands the learner every logged decision (per-worker observation rows, the sampled
action indices, the policy's value and log-probability) and, with the next report of the same job,
the reward of that decision's interval. One *transition* is one worker's (obs, action, reward,
next value) of one interval; GAE runs over each (job, worker) trajectory with the bundle's gamma
and lambda.

Every ``update_every`` new transitions, :meth:`OnlineLearner.step`:

1. copies the serving version's policy and runs SB3 PPO's own update (``PPO.train``: clipped
   surrogate, value loss, entropy bonus, ``n_epochs`` passes) on the newest ``window``
   transitions at a small learning rate;
2. validates the candidate on simulated held-out tasks (the benchmark's *train* split, seeds
   >= 100; never its test split) with :mod:`dynamix_gym.benchmark.validation`: mean time to
   accuracy, the time budget where the target is missed (the benchmark's one score);
3. promotes it only if that beats the parent's validation score by ``min_gain`` (``validation_score``:
   the mean time to accuracy in seconds, or the geometric mean over tasks of the candidate's time
   over the parent's, which weighs a 40 s NCF task as much as a 1,400 s BERT one): the candidate is
   saved as a bundle ``<versions_dir>/vNNN`` whose metadata carries its lineage (parent, data,
   learning rate, scores) and the service swaps to it; otherwise it is rejected and logged.

Rollback: a promoted version is then *measured* on the jobs it serves. Every job that ends
(target reached, or its time budget spent) served by one version gives a time to accuracy. Once
``rollback_window`` jobs of the serving version have ended, :meth:`OnlineLearner.regression`
compares them with the parent's jobs on the same tasks (``rollback_test``):

- ``stratified`` (the default): the log time to accuracy's difference to the parent per task,
  pooled over tasks with inverse-variance weights (a task with more jobs on both sides, or less
  seed noise, counts more; Welch-Satterthwaite degrees of freedom); a task's seed noise is the
  pooled within-group variance of every version's jobs on it (groups of two jobs or more; NCF
  with a starved input pipeline varies 40-130 s from seed to seed, CIFAR-10 on A100 / T4 by 3%).
  The version is rolled back when its ratio to the parent,
  ``exp(difference)``, exceeds ``1 + rollback_tolerance`` *and* a one-sided t-test (scipy) finds it
  slower at level ``rollback_alpha``; while there is no noise estimate yet (one job per group), only
  a gross regression, a ratio above ``1 + rollback_gross``, rolls back. A job's seed moves its time
  to accuracy by 10-30% on the mixed-fault tasks, as much as a version's effect, so one wave of
  one job per task cannot tell a regression from seed noise.
- ``window``: the mean of the last ``rollback_window`` ratios (a job's time over the parent's mean
  on its task) above ``1 + rollback_tolerance`` (the rule before the test; kept for comparison).

A rolled-back version is marked ``rolled_back`` in ``lineage.json`` and the experience gathered
under it is dropped. Every event is appended to the service's transition log as well.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dynamix_gym.controllers.bundle import BundleMeta, PolicyBundle, load_bundle, save_bundle
from dynamix_gym.service.candidates import (
    CandidateJob,
    CandidateResult,
    build_candidate,
    build_candidate_in_child,
    copy_model,
    load_numpy_weights,
    ppo_update,
    replica_update,
    weights_to_numpy,
)
from dynamix_gym.service.rollback import measured_regression, window_ratios
from dynamix_gym.service.server import PolicyStore
from dynamix_gym.service.transitions import Transition, as_transitions
from dynamix_gym.service.translog import TransitionLog
from sim.datafiles import atomic_write_text

log = logging.getLogger(__name__)

#: How a candidate's validation is compared with its parent's (``LearnerConfig.validation_score``).
VALIDATION_SCORES = ("mean", "geomean")
#: How a candidate is made (``LearnerConfig.mode``): ``ppo`` on the logged transitions, or
#: ``replica``: DAgger on simulated replicas of the jobs served (:meth:`OnlineLearner.update_replica`).
LEARNER_MODES = ("ppo", "replica")
#: Where an update runs (``LearnerConfig.worker``): the learner's thread, or a child process.
WORKERS = ("thread", "process")
#: How a promoted version's measured regression is decided (``LearnerConfig.rollback_test``).
ROLLBACK_TESTS = ("stratified", "window")
#: Replicas (distinct cluster, workload, interval) the replica learner keeps, the newest first.
MAX_REPLICAS = 32


@dataclass
class LearnerConfig:
    """Online fine-tuning settings (conf/serve.yaml ``learner``)."""

    learning_rate: float = 1e-5
    update_every: int = 512  # new transitions (worker-intervals) between updates
    window: int = 4096  # newest transitions an update trains on
    n_epochs: int = 3
    batch_size: int = 256
    clip_range: float = 0.1
    ent_coef: float = 0.0
    min_gain: float = 0.005  # validation TTA must fall by this fraction for a promotion
    rollback_window: int = 3  # measured jobs of a promoted version before it is judged
    rollback_tolerance: float = 0.05  # TTA ratio to the parent above 1 + this (and significant): roll back
    rollback_test: str = "stratified"  # ROLLBACK_TESTS: how a measured regression is decided
    rollback_alpha: float = 0.05  # the one-sided t-test's level (stratified)
    rollback_gross: float = 0.25  # ratio above 1 + this rolls back without a test (stratified)
    # how a candidate's validation is compared with its parent's (VALIDATION_SCORES): "mean", the
    # mean TTA in seconds; "geomean", the geometric mean over tasks of candidate / parent
    validation_score: str = "mean"
    # how candidates are made (LEARNER_MODES); the replica learner's DAgger episodes per update (over
    # all replicas), cloning epochs and Adam learning rate
    mode: str = "ppo"
    replica_episodes: int = 200
    replica_epochs: int = 20
    replica_learning_rate: float = 3e-4
    # where an update's work runs (WORKERS): "thread", the learner's thread (any validate callable;
    # the interpreter lock then delays decisions while it trains); "process", a spawned child per
    # update (validate must pickle), so decisions keep their latency. The apps' configs use "process".
    worker: str = "thread"
    worker_timeout_s: float = 3600.0  # a child update that runs longer is terminated (the update fails)

    def __post_init__(self) -> None:
        if not 0.0 < self.learning_rate <= 1e-2:
            raise ValueError(f"learner.learning_rate must lie in (0, 0.01], got {self.learning_rate}")
        for name in ("update_every", "window", "n_epochs", "batch_size", "rollback_window"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {getattr(self, name)}")
        if self.window < self.update_every:
            raise ValueError("learner.window must be >= learner.update_every")
        if not 0.0 <= self.min_gain < 1.0 or self.rollback_tolerance < 0.0:
            raise ValueError("learner.min_gain must lie in [0, 1) and rollback_tolerance be >= 0")
        if self.mode not in LEARNER_MODES:
            raise ValueError(f"learner.mode must be one of {list(LEARNER_MODES)}, got {self.mode!r}")
        for name in ("replica_episodes", "replica_epochs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.replica_learning_rate <= 1e-2:
            raise ValueError(
                f"learner.replica_learning_rate must lie in (0, 0.01], got {self.replica_learning_rate}"
            )
        if self.rollback_test not in ROLLBACK_TESTS:
            raise ValueError(
                f"learner.rollback_test must be one of {list(ROLLBACK_TESTS)}, got {self.rollback_test!r}"
            )
        if not 0.0 < self.rollback_alpha < 1.0:
            raise ValueError(f"learner.rollback_alpha must lie in (0, 1), got {self.rollback_alpha}")
        if not self.rollback_gross > self.rollback_tolerance:
            raise ValueError(
                f"learner.rollback_gross must exceed rollback_tolerance ({self.rollback_tolerance}), "
                f"got {self.rollback_gross}"
            )
        if self.worker not in WORKERS:
            raise ValueError(f"learner.worker must be one of {list(WORKERS)}, got {self.worker!r}")
        if not 0.0 < self.worker_timeout_s < float("inf"):
            raise ValueError(
                f"learner.worker_timeout_s must be a positive number of seconds, got {self.worker_timeout_s}"
            )
        if self.validation_score not in VALIDATION_SCORES:
            raise ValueError(
                f"learner.validation_score must be one of {list(VALIDATION_SCORES)}, got {self.validation_score!r}"
            )


@dataclass
class _Pending:
    """A decision waiting for the reward of its interval."""

    obs: np.ndarray
    action: np.ndarray
    value: np.ndarray
    log_prob: np.ndarray
    version: int
    mask: np.ndarray | None = None  # (N, A) legal steps of a MaskablePPO bundle's decision


class OnlineLearner:
    """PPO fine-tuning of one served bundle from the service's experience.

    Args:
        store: the service's policies; ``name`` is the bundle it fine-tunes.
        versions_dir: where promoted versions (``vNNN`` bundles) and ``lineage.json`` go.
        validate: candidate bundle -> {validation task: mean TTA (s)}; lower is better.
        config: learning settings.
        rng: seeds PPO's minibatch order (SB3 draws from the global generators it seeds).
        log: the service's transition log, for lineage events (optional).
    """

    def __init__(
        self,
        store: PolicyStore,
        name: str,
        versions_dir: str | Path,
        validate: Callable[[PolicyBundle], dict[str, float]],
        config: LearnerConfig | None = None,
        rng: np.random.Generator | None = None,
        log: TransitionLog | None = None,
    ) -> None:
        self.store, self.name = store, name
        self.versions_dir = Path(versions_dir)
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self.validate = validate
        self.config = config or LearnerConfig()
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.translog = log
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._buffer: deque[Transition] = deque(maxlen=self.config.window)
        self._new = 0
        self._bundles: dict[int, PolicyBundle] = {}
        self._measured: dict[tuple[int, str], list[float]] = defaultdict(list)
        self._task_scores: dict[int, dict[str, float]] = {}
        self.lineage: list[dict[str, Any]] = []
        self._replicas: dict[tuple, dict[str, Any]] = {}
        self._closing = threading.Event()
        if self.config.worker == "process":
            try:
                pickle.dumps(validate)
            except Exception as exc:
                raise ValueError(
                    "learner.worker=process validates candidates in a child process, so validate must "
                    "pickle (a module-level function, or an object such as dynamix_gym.benchmark.validation.Validator); "
                    f"{validate!r} does not ({exc})"
                ) from None
        self._load_lineage()

    # --- lineage -------------------------------------------------------------------------------------
    def _lineage_file(self) -> Path:
        return self.versions_dir / "lineage.json"

    def _load_lineage(self) -> None:
        served = self.store.get(self.name)
        self._bundles[served.version] = served.bundle
        path = self._lineage_file()
        if path.exists():
            self.lineage = json.loads(path.read_text())["versions"]
            live = [e for e in self.lineage if e["status"] == "promoted"]
            if live:  # a restarted service serves the newest promoted version that stands
                latest = live[-1]
                bundle = load_bundle(latest["path"])
                self._bundles[latest["version"]] = bundle
                self.store.swap(self.name, bundle, latest["version"])
                if latest.get("validation_by_task"):
                    self._task_scores[latest["version"]] = dict(latest["validation_by_task"])
        else:
            self.lineage = [
                {
                    "version": served.version,
                    "parent": None,
                    "path": str(served.bundle.path),
                    "status": "promoted",
                    "note": "the pretrained bundle the service started from",
                    "t": time.time(),
                }
            ]
            self._write_lineage()

    def _write_lineage(self) -> None:
        atomic_write_text(self._lineage_file(), json.dumps({"versions": self.lineage}, indent=1) + "\n")

    def _event(self, kind: str, **fields: Any) -> None:
        rec = {"kind": kind, "bundle": self.name, "t": time.time(), **fields}
        if self.translog is not None:
            self.translog.append(rec)
        log.info("learner %s: %s", kind, fields)

    def _entry(self, version: int) -> dict[str, Any]:
        return next(e for e in self.lineage if e["version"] == version)

    # --- experience ---------------------------------------------------------------------------------
    def observe(self, record: dict[str, Any]) -> None:
        """A logged decision: completes the previous decision of the same job with its reward."""
        if record.get("bundle") != self.name:
            return
        # the job first: a (job, worker) trajectory sorts the same whatever order jobs' calls arrived in
        key = f"{record.get('job', '')}/{record['session']}"
        value = np.asarray(record["value"], dtype=np.float64)
        with self._lock:
            prev = self._pending.pop(key, None)
            if prev is not None and record["reward"] is not None:
                self._add(key, prev, float(record["reward"]), bool(record["done"]), value)
            if not record["done"]:
                self._pending[key] = _Pending(
                    np.asarray(record["obs"], dtype=np.float32),
                    np.asarray(record["action"], dtype=np.int64),
                    value,
                    np.asarray(record["log_prob"], dtype=np.float64),
                    int(record["version"]),
                    None if record.get("mask") is None else np.asarray(record["mask"], dtype=bool),
                )

    def _add(self, key: str, prev: _Pending, reward: float, done: bool, next_value: np.ndarray) -> None:
        for i in range(len(prev.action)):
            self._buffer.append(
                Transition(
                    session=key,
                    worker=i,
                    obs=prev.obs[i],
                    action=int(prev.action[i]),
                    value=float(prev.value[i]),
                    log_prob=float(prev.log_prob[i]),
                    reward=reward,
                    done=done,
                    next_value=float(next_value[i]) if i < len(next_value) else 0.0,
                    version=prev.version,
                    mask=None if prev.mask is None else prev.mask[i],
                )
            )
            self._new += 1

    def add_transitions(self, transitions: Sequence[Sequence]) -> None:
        r"""Feed transitions directly (:class:`Transition`\ s, or tuples in its field order):
        replays of a log, and the poisoning test. Without a mask a MaskablePPO bundle's transition
        counts every step as legal."""
        items = as_transitions(transitions)
        with self._lock:
            for t in items:
                self._buffer.append(t)
                self._new += 1

    def _sorted(self) -> list[Transition]:
        return sorted(self._buffer, key=lambda t: str(t.session))

    def transitions(self) -> list[Transition]:
        """The buffered transitions by trajectory, each in its own order (a copy)."""
        with self._lock:
            return self._sorted()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def register(self, spec: Any, interval: int) -> bool:
        """A job registered (its :class:`~sim.protocol.BackendSpec` and K): with ``mode=replica``,
        remember its replica, the job's GPU types (one node per type), workload and interval, for
        :meth:`update_replica`. A workload the simulator does not ship has no replica (``False``)."""
        if self.config.mode != "replica":
            return False
        from sim.cluster import mixed_cluster
        from sim.workloads import WORKLOADS

        if spec.workload not in WORKLOADS:
            return False
        counts = dict(sorted(Counter(spec.gpu_types).items()))
        key = (tuple(counts.items()), spec.workload, int(interval))
        with self._lock:
            self._replicas.pop(key, None)
            self._replicas[key] = {
                "cluster": mixed_cluster(counts),
                "workload": spec.workload,
                "interval": int(interval),
            }
            while len(self._replicas) > MAX_REPLICAS:
                self._replicas.pop(next(iter(self._replicas)))
        return True

    @property
    def replicas(self) -> list[dict[str, Any]]:
        """The remembered replicas in the order of their keys, not of registration: concurrent jobs
        register in any order, and each replica's collection seed is drawn in this order."""
        with self._lock:
            return [self._replicas[k] for k in sorted(self._replicas, key=repr)]

    # --- measurement and rollback --------------------------------------------------------------------
    def job_end(self, record: dict[str, Any]) -> None:
        """A job ended: its time to accuracy measures the version that served it."""
        if record.get("bundle") != self.name or not record.get("pure") or record.get("tta_s") is None:
            return
        version, task = int(record["version"]), str(record.get("task", ""))
        with self._lock:
            self._measured[(version, task)].append(float(record["tta_s"]))
        self._check_rollback()

    def ratios(self, version: int) -> list[float]:
        """Measured TTA of ``version``'s jobs / its parent's mean on the same task."""
        parent = self._entry(version).get("parent")
        return [] if parent is None else window_ratios(self._measured, version, int(parent))

    def regression(self, version: int) -> dict[str, Any] | None:
        """The measured regression of ``version`` against its parent (:func:`~dynamix_gym.service.
        rollback.measured_regression`), or ``None`` before ``rollback_window`` of its jobs have ended."""
        parent = self._entry(version).get("parent")
        if parent is None:
            return None
        with self._lock:
            measured = {k: list(v) for k, v in self._measured.items()}
        return measured_regression(measured, version, int(parent), self.config)

    def _check_rollback(self) -> None:
        served = self.store.get(self.name)
        entry = self._entry(served.version)
        found = self.regression(served.version)
        if found is None:
            return
        mean = found["ratio"]
        entry["measured_tta_ratio"] = mean
        entry["measured"] = {k: v for k, v in found.items() if k != "ratio"}
        if not found["rollback"]:
            self._write_lineage()
            return
        parent = int(entry["parent"])
        self.store.swap(self.name, self._bundles[parent], parent)
        entry["status"] = "rolled_back"
        entry["rolled_back_t"] = time.time()
        self._write_lineage()
        with self._lock:
            self._buffer = deque(
                (t for t in self._buffer if t.version != served.version), maxlen=self.config.window
            )
            self._new = 0
        self._event(
            "rollback", version=served.version, parent=parent, measured_tta_ratio=mean, **entry["measured"]
        )

    # --- updates -----------------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self._new >= self.config.update_every

    def step(self, force: bool = False, skip_validation: bool = False) -> dict[str, Any] | None:
        """One update if enough new experience arrived (or ``force``); the lineage entry or None.

        ``skip_validation`` promotes the candidate without validating it (an operator's manual
        promotion; the measured rollback still guards it).
        """
        replica = self.config.mode == "replica"
        if not (force or self.ready()) or not (self.replicas if replica else self._buffer):
            return None
        with self._lock:
            # by trajectory (a stable sort keeps each one's order): concurrent jobs interleave their
            # transitions by arrival, which must not change the update
            data = self._sorted()
            self._new = 0
        parent = self.store.get(self.name)
        t_start = time.time()
        result = self._build(parent, data if not replica else [], skip_validation)
        self.rng = result.rng
        if result.parent_scores is not None:
            self._task_scores[parent.version] = result.parent_scores
        parent_tasks = {} if skip_validation else self._task_scores[parent.version]
        stats, scores = result.stats, result.scores
        version = max(e["version"] for e in self.lineage) + 1
        parent_score = _mean(parent_tasks)
        cand_score = _mean(scores)
        ratio = (
            float(np.exp(np.mean([np.log(scores[t] / parent_tasks[t]) for t in scores])))
            if scores and set(scores) == set(parent_tasks)
            else float("nan")
        )
        entry = {
            "version": version,
            "parent": parent.version,
            "transitions": len(data),
            "jobs": len({t.session for t in data}),
            "mode": self.config.mode,
            "learning_rate": self.config.replica_learning_rate if replica else self.config.learning_rate,
            "update": stats,
            "validation_tta_s": None if skip_validation else cand_score,
            "validation_by_task": scores,
            "parent_validation_tta_s": None if skip_validation else parent_score,
            "validation_ratio_to_parent": None if skip_validation else ratio,
            "t_start": t_start,  # the update and its validation ran from t_start to t
            "t": time.time(),
        }
        if self.config.validation_score == "geomean":
            passed = ratio < 1.0 - self.config.min_gain
        else:
            passed = cand_score < parent_score * (1.0 - self.config.min_gain)
        if skip_validation or passed:
            path = self.versions_dir / f"v{version:03d}"
            meta = replace(
                parent.bundle.meta,
                metadata={**parent.bundle.meta.metadata, "lineage": {k: v for k, v in entry.items()}},
            )
            model = result.model
            if model is None:  # from a child: the weights, on a fresh copy of the parent's model
                model = copy_model(parent.bundle)
                load_numpy_weights(model.policy, result.state)
            save_bundle(path, model, BundleMeta(**meta.__dict__), parent.bundle.obs_norm)
            bundle = load_bundle(path)
            self._bundles[version] = bundle
            if not skip_validation:
                self._task_scores[version] = dict(scores)
            entry.update(status="promoted", path=str(path), validated=not skip_validation)
            self.lineage.append(entry)
            self._write_lineage()
            self.store.swap(self.name, bundle, version)
            self._event("promote", **{k: entry[k] for k in ("version", "parent", "validation_tta_s")})
        else:
            entry.update(status="rejected")
            self.lineage.append(entry)
            self._write_lineage()
            self._event("reject", version=version, parent=parent.version, validation_tta_s=cand_score)
        return entry

    def _build(self, parent: Any, data: list[Transition], skip_validation: bool) -> CandidateResult:
        """The candidate of ``parent`` (a :class:`~dynamix_gym.service.server.ServedPolicy`) and its
        validation, on this thread or in a child (``config.worker``)."""
        cfg = self.config
        cached = None if skip_validation else (self._task_scores.get(parent.version) or None)
        job = CandidateJob(
            config=cfg,
            rng=self.rng,
            data=data,
            replicas=self.replicas if cfg.mode == "replica" else [],
            validate=None if skip_validation else self.validate,
            parent_scores=cached,
        )
        if cfg.worker == "thread":
            job.parent = parent.bundle
            return build_candidate(job)
        from dynamix_gym.service.child import call_in_child

        job.parent_path = Path(parent.bundle.path)
        job.parent_state = weights_to_numpy(parent.bundle.model.policy)
        return call_in_child(
            build_candidate_in_child,
            job,
            cancel=self._closing,
            timeout_s=float(cfg.worker_timeout_s),
            name=f"learner-update-{self.name}",
        )

    def close(self) -> None:
        """Stop: an update running in a child is terminated (the serving version stays)."""
        self._closing.set()

    def update(self, parent: PolicyBundle, data: list[Transition]) -> tuple[Any, dict[str, float]]:
        """A copy of ``parent``'s model after one PPO update on ``data`` (:func:`ppo_update`)."""
        return ppo_update(parent, data, self.config, self.rng)

    def update_replica(self, parent: PolicyBundle) -> tuple[Any, dict[str, float]]:
        """A copy of ``parent``'s model after DAgger on replicas of the jobs served (:func:`replica_update`)."""
        return replica_update(parent, self.replicas, self.config, self.rng)

    # --- background ----------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Update whenever enough experience arrived, until ``stop`` is set (a service thread)."""
        while not stop.is_set():
            if self.ready():
                try:
                    self.step()
                except Exception:  # a failed update must not take the service down
                    if self._closing.is_set():
                        return  # stopping: the child was terminated
                    log.exception("online update failed; the serving version is unchanged")
            stop.wait(poll_s)


def attach_learner(
    service: Any,
    store: PolicyStore,
    versions: str | Path,
    learner: dict[str, Any],
    validation: dict[str, Any],
    seed: int,
) -> OnlineLearner:
    """The online learner of the store's default bundle with ``learner`` settings
    (:class:`LearnerConfig`'s fields) and ``validation`` (:func:`~dynamix_gym.benchmark.validation.
    make_validator`'s block), its candidates kept under ``versions``, attached to ``service``
    (the one place the serve and online_learning apps build it)."""
    from dynamix_gym.benchmark.validation import make_validator

    online = OnlineLearner(
        store,
        "default",
        versions,
        make_validator(validation),
        LearnerConfig(**learner),
        rng=np.random.default_rng(int(seed) + 1),
        log=service.log,
    )
    service.learner = online
    return online


def _mean(scores: dict[str, float]) -> float:
    """Mean validation TTA over tasks (NaN without validation)."""
    return float(np.mean(list(scores.values()))) if scores else float("nan")
