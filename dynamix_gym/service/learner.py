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
   >= 100; never its test split): mean time to accuracy, twice the time used when the target is
   missed (as pretraining's validation);
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
from dynamix_gym.service.server import PolicyStore
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
#: The smallest seed-noise variance of log time to accuracy the rollback test assumes for a task
#: (a 1% standard deviation): a task measured twice alike must not weigh without bound.
NOISE_FLOOR_VAR = 1e-4
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
        # (session, worker, obs, action, value, log_prob, reward, done, next_value, version[, mask])
        self._buffer: deque[tuple] = deque(maxlen=self.config.window)
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
                (
                    key,
                    i,
                    prev.obs[i],
                    int(prev.action[i]),
                    float(prev.value[i]),
                    float(prev.log_prob[i]),
                    reward,
                    done,
                    float(next_value[i]) if i < len(next_value) else 0.0,
                    prev.version,
                    None if prev.mask is None else prev.mask[i],
                )
            )
            self._new += 1

    def add_transitions(self, transitions: Sequence[tuple]) -> None:
        """Feed transitions directly (session, worker, obs, action, value, log_prob, reward, done,
        next_value, version[, mask]): replays of a log, and the poisoning test. Without a mask a
        MaskablePPO bundle's transition counts every step as legal."""
        with self._lock:
            for t in transitions:
                self._buffer.append(tuple(t))
                self._new += 1

    def _sorted(self) -> list[tuple]:
        return sorted(self._buffer, key=lambda t: str(t[0]))

    def transitions(self) -> list[tuple]:
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
        entry = self._entry(version)
        parent = entry.get("parent")
        if parent is None:
            return []
        out = []
        for (v, task), ttas in list(self._measured.items()):
            ref = self._measured.get((parent, task))
            if v == version and ref:
                mean_ref = float(np.mean(ref))
                out += [t / mean_ref for t in ttas]
        return out

    def regression(self, version: int) -> dict[str, Any] | None:
        """The measured regression of ``version`` against its parent, or ``None`` before
        ``rollback_window`` of its jobs have ended: ``ratio`` (its time to accuracy over the
        parent's), ``jobs``, ``rollback`` (the decision) and, for the stratified test, ``p_value``
        and ``df`` (``None`` without a noise estimate)."""
        entry = self._entry(version)
        parent = entry.get("parent")
        if parent is None:
            return None
        cfg = self.config
        with self._lock:
            measured = {k: list(v) for k, v in self._measured.items()}
        jobs = sum(len(t) for (v, _), t in measured.items() if v == version)
        if jobs < cfg.rollback_window:
            return None
        if cfg.rollback_test == "window":
            ratios = self.ratios(version)[-cfg.rollback_window :]
            if not ratios:
                return None
            ratio = float(np.mean(ratios))
            return {"ratio": ratio, "jobs": jobs, "rollback": ratio > 1.0 + cfg.rollback_tolerance}
        from scipy import stats

        logs = {k: np.log(np.asarray(t, dtype=np.float64)) for k, t in measured.items()}
        diffs, sizes, noise = [], [], []
        for (v, task), lv in logs.items():
            lp = logs.get((int(parent), task))
            if v != version or lp is None or not len(lp):
                continue
            diffs.append(float(lv.mean() - lp.mean()))
            sizes.append(1.0 / len(lv) + 1.0 / len(lp))
            # the task's seed noise: the pooled within-group variance of every version's jobs on it
            groups = [g for (_, t), g in logs.items() if t == task and len(g) > 1]
            df_k = sum(len(g) - 1 for g in groups)
            ss_k = sum(float(((g - g.mean()) ** 2).sum()) for g in groups)
            noise.append((max(ss_k / df_k, NOISE_FLOOR_VAR), df_k) if df_k else None)
        if not diffs:
            return None
        known = [i for i, n in enumerate(noise) if n is not None]
        out: dict[str, Any] = {"jobs": jobs, "p_value": None, "df": None}
        if known:  # inverse-variance weights over the tasks whose noise is known (Welch-Satterthwaite df)
            var = np.array([noise[i][0] * sizes[i] for i in known])
            w = (1.0 / var) / (1.0 / var).sum()
            effect = float(np.dot(w, [diffs[i] for i in known]))
            se2 = float((w**2 * var).sum())
            df = se2**2 / float(sum((w[j] ** 2 * var[j]) ** 2 / noise[i][1] for j, i in enumerate(known)))
            out["df"] = df
        else:
            w = 1.0 / np.asarray(sizes)
            effect = float(np.dot(w, diffs) / w.sum())
        out["ratio"] = ratio = float(np.exp(effect))
        if ratio <= 1.0 + cfg.rollback_tolerance:
            out["rollback"] = False
        elif ratio > 1.0 + cfg.rollback_gross:
            out["rollback"] = True
        elif not known:
            out["rollback"] = False  # no noise estimate yet: wait for a second job of some group
        else:
            out["p_value"] = float(stats.t.sf(effect / np.sqrt(se2), out["df"]))
            out["rollback"] = out["p_value"] < cfg.rollback_alpha
        return out

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
                (t for t in self._buffer if t[9] != served.version), maxlen=self.config.window
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
            "jobs": len({t[0] for t in data}),
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

    def _build(self, parent: Any, data: list[tuple], skip_validation: bool) -> CandidateResult:
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

    def update(self, parent: PolicyBundle, data: list[tuple]) -> tuple[Any, dict[str, float]]:
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


def _mean(scores: dict[str, float]) -> float:
    """Mean validation TTA over tasks (NaN without validation)."""
    return float(np.mean(list(scores.values()))) if scores else float("nan")


# --- candidates: pure functions of their inputs, run on the learner's thread or in a child -----
def ppo_update(
    parent: PolicyBundle, data: list[tuple], cfg: LearnerConfig, rng: np.random.Generator
) -> tuple[Any, dict[str, float]]:
    """A copy of ``parent``'s model after one PPO update on ``data`` (sb3-contrib's MaskablePPO
    update, with each decision's logged legal steps, for a maskable bundle)."""
    from stable_baselines3.common.buffers import RolloutBuffer
    from stable_baselines3.common.logger import configure

    maskable = parent.meta.algorithm == "maskable_ppo"
    if maskable:
        from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer as buffer_cls
    else:
        buffer_cls = RolloutBuffer
    model = copy_model(parent)  # the serving weights
    obs, actions, values, logp, adv, returns = gae(data, float(model.gamma), float(model.gae_lambda))
    n = len(actions)
    buf = buffer_cls(
        n, model.observation_space, model.action_space, device="cpu", gamma=model.gamma, n_envs=1
    )
    if maskable:
        width = int(buf.mask_dims)  # a centralised bundle's flat (N * A) mask
        masks = np.ones((n, width), dtype=np.float32)
        for i, t in enumerate(data):
            if len(t) > 10 and t[10] is not None:
                masks[i] = np.asarray(t[10], dtype=np.float32).reshape(width)
        buf.action_masks[:] = masks[:, None, :]
    buf.observations[:] = obs[:, None, :]
    buf.actions[:] = actions.reshape(n, 1, 1)
    buf.values[:] = values[:, None]
    buf.log_probs[:] = logp[:, None]
    buf.advantages[:] = adv[:, None]
    buf.returns[:] = returns[:, None]
    buf.pos, buf.full = n, True
    lr = float(cfg.learning_rate)
    model.rollout_buffer = buf
    model.learning_rate = lr
    model.lr_schedule = lambda _progress: lr
    model.clip_range = lambda _progress: float(cfg.clip_range)
    model.n_epochs, model.batch_size, model.ent_coef = (
        int(cfg.n_epochs),
        int(cfg.batch_size),
        float(cfg.ent_coef),
    )
    model.set_logger(configure(None, [""]))
    model.set_random_seed(int(rng.integers(2**31)))
    model.train()
    values_out = model.logger.name_to_value
    stats = {k.split("/")[-1]: float(v) for k, v in values_out.items() if k.startswith("train/")}
    stats["samples"] = n
    return model, stats


def copy_model(parent: PolicyBundle):
    """A fresh copy of ``parent``'s model with the serving weights."""
    if parent.meta.algorithm == "maskable_ppo":
        from sb3_contrib import MaskablePPO as algo
    else:
        from stable_baselines3 import PPO as algo
    model = algo.load(parent.path / "model.zip", device="cpu")
    model.policy.load_state_dict(parent.model.policy.state_dict())
    return model


def replica_update(
    parent: PolicyBundle, replicas: list[dict[str, Any]], cfg: LearnerConfig, rng: np.random.Generator
) -> tuple[Any, dict[str, float]]:
    """A copy of ``parent``'s model after DAgger on simulated replicas of the jobs served.

    Each replica is the simulator run on a served job's GPU types, workload and interval, with
    the fault families, intensities and speed spread of the bundle's own training worlds (its
    ``config.domain``); the candidate acts, the bundle's teacher (its ``expert_pretrain``'s
    oracle, else the time-to-target oracle) labels every state it visits, and the policy is
    cloned on those labels (cross-entropy, every episode weighted alike, with the value head's
    regression) for ``replica_epochs`` at ``replica_learning_rate``: DYNAMIX's online
    fine-tuning done in the service's simulator, on the clusters and jobs it actually serves.
    """
    from dynamix_gym.learning.imitation import collect_expert_data, pretrain

    if not replicas:
        raise RuntimeError("the replica learner has no registered job to replicate yet")
    if parent.meta.algorithm not in ("ppo", "maskable_ppo") or parent.meta.obs_form != "per_worker":
        raise ValueError("the replica learner fine-tunes per-worker PPO bundles only")
    conf = dict(parent.meta.config or {})
    teacher = dict(conf.get("expert_pretrain") or {})
    expert = str(teacher.get("expert", "oracle"))
    expert_kwargs = dict(
        teacher.get("expert_kwargs") or {"objective": "time_to_target", "batch_penalty": 0.0}
    )
    base_domain = {
        k: v
        for k, v in dict(conf.get("domain") or {}).items()
        if k not in ("gpu_types", "profile", "workers")
    }
    env_kwargs = {
        **dict(conf.get("env") or {}),
        "split": parent.meta.split,
        "split_tolerance": parent.meta.split_tolerance,
    }
    model = copy_model(parent)
    obs_fn = parent.obs_norm if parent.obs_norm is not None else (lambda x: x)
    per = max(1, -(-int(cfg.replica_episodes) // len(replicas)))
    data = None
    for r in replicas:
        domain = {**base_domain, "cluster": r["cluster"], "workloads": [r["workload"]]}
        part = collect_expert_data(
            domain,
            {**env_kwargs, "interval": r["interval"]},
            [r["cluster"].num_workers],
            episodes=per,
            gamma=float(model.gamma),
            seed=int(rng.integers(2**31)),
            expert=expert,
            expert_kwargs=expert_kwargs,
            policy=model,
            obs_fn=obs_fn,
            action_mode=parent.meta.action_mode,
        )
        data = part if data is None else data + part
    scale = float(np.sqrt(np.var(data.returns) + 1e-8))
    stats = pretrain(
        model,
        data,
        obs_fn,
        scale,
        epochs=int(cfg.replica_epochs),
        learning_rate=float(cfg.replica_learning_rate),
        seed=int(rng.integers(2**31)),
        per_episode=True,
    )
    stats.update(replicas=len(replicas), episodes=per * len(replicas), expert_mean_tta_s=data.mean_tta_s)
    return model, stats


def gae(data: list[tuple], gamma: float, lam: float):
    """Advantages and returns per (job, worker) trajectory, in the buffer's order."""
    n = len(data)
    obs = np.stack([t[2] for t in data]).astype(np.float32)
    actions = np.array([t[3] for t in data], dtype=np.int64)
    values = np.array([t[4] for t in data], dtype=np.float64)
    logp = np.array([t[5] for t in data], dtype=np.float64)
    rewards = np.array([t[6] for t in data], dtype=np.float64)
    done = np.array([t[7] for t in data], dtype=bool)
    next_v = np.array([t[8] for t in data], dtype=np.float64)
    adv = np.zeros(n)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(data):
        groups[(t[0], t[1])].append(i)
    # The critic learnt VecNormalize's scaled returns, a scale the bundle does not keep: put the
    # rewards on the critic's scale by matching the spread of discounted returns to the values'.
    mc = np.zeros(n)
    for idx in groups.values():
        acc = 0.0
        for j in reversed(idx):
            acc = rewards[j] + gamma * (0.0 if done[j] else acc)
            mc[j] = acc
    spread, v_spread = float(mc.std()), float(values.std())
    rewards = rewards * (v_spread / spread if spread > 1e-9 and v_spread > 1e-9 else 1.0)
    for idx in groups.values():
        last = 0.0
        for j in reversed(idx):
            nonterminal = 0.0 if done[j] else 1.0
            delta = rewards[j] + gamma * next_v[j] * nonterminal - values[j]
            last = delta + gamma * lam * nonterminal * last
            adv[j] = last
    return obs, actions, values, logp, adv, adv + values


@dataclass
class CandidateJob:
    """Everything an update needs, picklable for :func:`~dynamix_gym.service.child.call_in_child`.

    ``parent`` is the serving bundle on the learner's thread; a child gets ``parent_path`` and the
    serving weights (``parent_state``) and loads the bundle itself. ``rng`` is the learner's own
    generator (a child advances a copy and sends it back), so both workers draw the same seeds.
    """

    config: LearnerConfig
    rng: np.random.Generator
    data: list[tuple]
    replicas: list[dict[str, Any]]
    validate: Callable[[PolicyBundle], dict[str, float]] | None  # None: no validation (skip_validation)
    parent_scores: dict[str, float] | None  # the parent's cached validation, or None to compute it
    parent: PolicyBundle | None = None
    parent_path: Path | None = None
    parent_state: dict[str, np.ndarray] | None = None


@dataclass
class CandidateResult:
    rng: np.random.Generator
    stats: dict[str, float]
    scores: dict[str, float]  # the candidate's validation ({} without)
    parent_scores: dict[str, float] | None  # computed here (None: the job had them, or no validation)
    model: Any = None  # on the learner's thread
    state: dict[str, np.ndarray] | None = None  # from a child: the candidate's policy weights


def weights_to_numpy(policy) -> dict[str, np.ndarray]:
    """A policy's weights as numpy copies: torch's own pickling of tensors between processes passes
    shared-memory handles, which die with the process that sent them."""
    return {k: v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}


def load_numpy_weights(policy, weights: dict[str, np.ndarray]) -> None:
    import torch

    policy.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})


def build_candidate(job: CandidateJob) -> CandidateResult:
    """Validate the parent if needed, make the candidate (:func:`ppo_update` or
    :func:`replica_update`), validate it: the part of an update that does not touch the service."""
    parent = job.parent
    if parent is None:
        parent = load_bundle(job.parent_path)
        load_numpy_weights(parent.model.policy, job.parent_state)
    parent_scores = None
    if job.validate is not None and job.parent_scores is None:
        parent_scores = dict(job.validate(parent))
    if job.config.mode == "replica":
        model, stats = replica_update(parent, job.replicas, job.config, job.rng)
    else:
        model, stats = ppo_update(parent, job.data, job.config, job.rng)
    candidate = PolicyBundle(parent.path, parent.meta, model, parent.obs_norm)
    scores = dict(job.validate(candidate)) if job.validate is not None else {}
    return CandidateResult(job.rng, stats, scores, parent_scores, model=model)


def build_candidate_in_child(job: CandidateJob) -> CandidateResult:
    """:func:`build_candidate` as a child's call: the weights come back, not the SB3 model."""
    result = build_candidate(job)
    result.state = weights_to_numpy(result.model.policy)
    result.model = None
    return result
