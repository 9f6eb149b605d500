"""The arbitrator: one service that holds policy bundles and decides every registered job's batches.

A job registers once (its cluster spec, workload, observation schema version and K), then sends
one interval report per decision and receives every worker's next local batch. The service keeps,
per job, the observation encoder's short history and the batches in force, so a job sends only
what it measured. Decisions are numbered per job (``seq``): a retried report (same ``seq``) gets
the decision it already got, never a second one, and a skipped ``seq`` is refused, so no decision
is dropped or duplicated silently.

What a shared server needs, here:

* every call carries ``authorization: Bearer <token>``, checked before any handler runs, and the
  gRPC server bounds message sizes and concurrent calls (:mod:`dynamix_gym.service.transport`);
  registrations are bounded by ``max_jobs`` and sessions idle for ``idle_timeout_s`` are dropped;
* every refused call is logged with its cause, the caller's address and its job, never the token
  (:func:`~dynamix_gym.service.transport.log_refusal`);
* every field of a registration and a report is validated (:mod:`dynamix_gym.service.messages`):
  a malformed or hostile message is refused with ``INVALID_ARGUMENT`` naming the field and its
  range, and nothing it carried reaches the policy, the log or the learner;
* an unexpected error inside a handler is logged and answered ``INTERNAL``; it never stops the
  service.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from dynamix_gym.actions import DISCRETE_ACTION_MODES, ActionRule
from dynamix_gym.benchmark.scoring import run_score_s
from dynamix_gym.controllers.bundle import BundleMismatchError, InputRange, PolicyBundle
from dynamix_gym.decision import DecisionStep, policy_forward
from dynamix_gym.obs import make_encoder
from dynamix_gym.obs.v4 import SCHEMA_VERSION_V4
from dynamix_gym.reward import RewardConfig
from dynamix_gym.service import arbitrator_pb2 as pb
from dynamix_gym.service import arbitrator_pb2_grpc as pb_grpc
from dynamix_gym.service.messages import (
    FieldError,
    batches_from_proto,
    check_bundle_schema,
    check_register,
    report_from_proto,
    spec_from_proto,
)
from dynamix_gym.service.translog import TransitionLog, last_seqs
from dynamix_gym.service.transport import log_refusal
from sim.protocol import BackendSpec

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------------------------
@dataclass
class ServedPolicy:
    """One version of a served bundle."""

    name: str
    version: int
    bundle: PolicyBundle
    reward: RewardConfig
    lock: threading.Lock = field(default_factory=threading.Lock)


def bundle_reward(bundle: PolicyBundle) -> RewardConfig:
    """The reward the bundle was trained with (its config), else the default."""
    return RewardConfig.from_any(bundle.meta.config.get("reward") or "dynamix")


def policy_is_learned(learner: Any, name: str) -> bool:
    """Whether ``learner`` fine-tunes the served bundle ``name`` (and takes registrations)."""
    return getattr(learner, "name", None) == name and hasattr(learner, "register")


class PolicyStore:
    """Served bundles by name; the learner swaps a name's version atomically."""

    def __init__(self, bundles: dict[str, PolicyBundle], default: str | None = None) -> None:
        if not bundles:
            raise ValueError("the arbitrator needs at least one bundle")
        for name, b in bundles.items():
            mode = getattr(b.meta, "action_mode", "delta")
            if mode not in DISCRETE_ACTION_MODES:
                raise BundleMismatchError(
                    f"bundle {name!r} ({b.path}) emits {mode!r} actions; the arbitrator serves the discrete "
                    f"modes {list(DISCRETE_ACTION_MODES)}"
                )
            if getattr(b.meta, "critic", "local") != "local":
                raise BundleMismatchError(
                    f"bundle {name!r} ({b.path}) was trained with a {b.meta.critic} critic; the arbitrator "
                    "serves and fine-tunes bundles with the local critic (critic=local)"
                )
        self._lock = threading.Lock()
        self._policies = {name: ServedPolicy(name, 0, b, bundle_reward(b)) for name, b in bundles.items()}
        self.default = default or next(iter(bundles))
        if self.default not in self._policies:
            raise ValueError(f"default bundle {self.default!r} is not among {sorted(self._policies)}")

    def names(self) -> list[str]:
        return sorted(self._policies)

    def get(self, name: str = "") -> ServedPolicy:
        with self._lock:
            key = name or self.default
            if key not in self._policies:
                raise KeyError(key)
            return self._policies[key]

    def swap(self, name: str, bundle: PolicyBundle, version: int) -> ServedPolicy:
        new = ServedPolicy(name, version, bundle, bundle_reward(bundle))
        with self._lock:
            self._policies[name] = new
        log.info("bundle %s now serves version %d (%s)", name, version, bundle.path)
        return new


# --------------------------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------------------------
@dataclass
class Session:
    id: str
    job_id: str
    task: str
    policy_name: str
    spec: BackendSpec
    #: the env's decision step for the bundle: its schema's encoder (the short history), its discrete
    #: steps and split over the job's workers, the job's end and the interval's reward
    step: DecisionStep
    next_seq: int
    last_seen: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    last: pb.Decision | None = None
    versions: Counter = field(default_factory=Counter)
    decisions: int = 0
    ended: bool = False
    rng: np.random.Generator | None = None  # the job's exploration draws
    #: per input the decisions at which the policy read it far out of its training range
    input_range: InputRange | None = None


@dataclass
class ServiceConfig:
    """Limits and modes of an :class:`ArbitratorService` (conf/serve.yaml)."""

    max_jobs: int = 256
    idle_timeout_s: float = 600.0
    explore: bool = False  # sample actions (online mode) instead of the most likely one
    log_obs_digits: int = 4  # rounding of the logged observations
    #: an input this many standard deviations or more from the bundle's training mean is out of range
    out_of_range_sd: float = 6.0

    def __post_init__(self) -> None:
        if not 0.0 < self.out_of_range_sd <= 1e6:
            raise ValueError(
                f"out_of_range_sd must lie in (0, 1e6] standard deviations, got {self.out_of_range_sd}"
            )
        if not 1 <= self.max_jobs <= 100_000:
            raise ValueError(f"max_jobs must lie in [1, 100000], got {self.max_jobs}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s}")


class ArbitratorService(pb_grpc.ArbitratorServicer):
    """The servicer. ``learner`` (optional) receives every logged decision and job end.

    Args:
        store: the served bundles.
        log_path: the append-only transition log (JSON lines); resumed after a restart.
        config: limits and modes.
        rng: seeds the exploration draws: each job draws from its own generator, keyed by this
            seed and its job id, so that concurrent jobs' experience does not depend on the order
            their calls arrive in (session ids come from the OS: :mod:`secrets`).
        learner: an :class:`~dynamix_gym.service.learner.OnlineLearner` or ``None``.
        clock: seconds, monotonic (tests inject one).
    """

    def __init__(
        self,
        store: PolicyStore,
        log_path: str | Path,
        config: ServiceConfig | None = None,
        rng: np.random.Generator | None = None,
        learner: Any = None,
        clock=time.monotonic,
    ) -> None:
        self.store = store
        self.config = config or ServiceConfig()
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._explore_seed = int(self.rng.integers(2**63 - 1))
        self.log = TransitionLog(log_path)
        self._resume_seqs = last_seqs(log_path)
        self.learner = learner
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.stats: Counter = Counter()
        #: seconds each decision took inside the service (newest 100,000: bounded memory)
        self.decide_s: deque[float] = deque(maxlen=100_000)

    # --- helpers ---------------------------------------------------------------------------------
    def _refuse(self, context, code: grpc.StatusCode, message: str, rpc: str, job: str | None):
        """Count, log (cause, peer, job) and abort the call with ``code`` and ``message``."""
        self.stats[f"refused_{code.name.lower()}"] += 1
        log_refusal(rpc, context.peer(), job, code, message)
        context.abort(code, message)

    def _expire(self, now: float) -> None:
        idle = [s for s in self._sessions.values() if now - s.last_seen > self.config.idle_timeout_s]
        for s in idle:
            del self._sessions[s.id]
            self.stats["expired"] += 1

    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def job_of(self, session_id: str) -> str | None:
        """The job holding ``session_id`` (``None``: no such session)."""
        with self._lock:
            session = self._sessions.get(session_id)
        return None if session is None else session.job_id

    # --- RPCs ----------------------------------------------------------------------------------------
    def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterReply:
        try:
            check_register(request)
            spec = spec_from_proto(request.spec, request.workload)
            try:
                served = self.store.get(request.bundle)
            except KeyError:
                raise FieldError(
                    "bundle", f"unknown bundle {request.bundle[:64]!r}; served: {self.store.names()}"
                ) from None
            meta = served.bundle.meta
            if meta.obs_form == "centralised" and meta.num_workers != spec.num_workers:
                raise BundleMismatchError(
                    f"bundle {served.name!r} is a centralised policy for {meta.num_workers} workers; "
                    f"the job has {spec.num_workers}"
                )
            check_bundle_schema(request.schema_version, served.name, meta.schema_version)
            if spec.compute_curve_s is None and meta.schema_version == SCHEMA_VERSION_V4:
                raise BundleMismatchError(
                    f"bundle {served.name!r} reads observation schema 4 (each worker's compute curve, "
                    "measured before the run), and the job registered none: register spec.compute_curve_s "
                    "(experiments.deploy calibrate.quick=true measures it), or serve a bundle of schema 1-3"
                )
            encoder = make_encoder(meta.schema_version, spec)
        except (FieldError, ValueError) as e:
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if isinstance(e, BundleMismatchError)
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            return self._refuse(context, code, str(e), "Register", request.job_id)
        try:  # the bundle's own steps and split, as its training env applied them
            rule = ActionRule.for_spec(
                meta.action_mode, spec, meta.action_set, meta.split, meta.split_tolerance
            )
        except ValueError as e:
            return self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"bundle {served.name!r} records an unusable action set: {e}",
                "Register",
                request.job_id,
            )
        step = DecisionStep(spec, rule, encoder, served.reward)
        now = self.clock()
        next_seq = max(int(request.next_seq), self._resume_seqs.get(request.job_id, -1) + 1)
        session = Session(
            # From the OS, not the injected generator: a restarted service with the same seed must
            # never hand out an id a job of the killed one still holds (nor may ids be guessable).
            id=secrets.token_hex(16),
            job_id=request.job_id,
            task=request.task,
            policy_name=served.name,
            spec=spec,
            step=step,
            next_seq=next_seq,
            last_seen=now,
            # keyed by the job and where it resumes: a re-registered job does not replay its draws
            rng=np.random.default_rng([self._explore_seed, zlib.crc32(request.job_id.encode()), next_seq]),
            input_range=InputRange(served.bundle, spec.num_workers, self.config.out_of_range_sd),
        )
        with self._lock:
            self._expire(now)
            if len(self._sessions) >= self.config.max_jobs:
                return self._refuse(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the service holds its maximum of {self.config.max_jobs} jobs (max_jobs)",
                    "Register",
                    request.job_id,
                )
            self._sessions[session.id] = session
        self.stats["registered"] += 1
        if self.learner is not None and policy_is_learned(self.learner, served.name):
            try:  # the replica learner remembers the job's cluster; a failure never refuses the job
                self.learner.register(spec, int(request.interval))
            except Exception:
                log.exception("the learner could not take job %s's registration", request.job_id)
        self.log.append(
            {
                "kind": "register",
                "job": request.job_id,
                "session": session.id,
                "task": request.task,
                "workers": spec.num_workers,
                "workload": spec.workload,
                "bundle": served.name,
                "version": served.version,
                "next_seq": next_seq,
                "t": time.time(),
            }
        )
        actions = step.rule
        scale = actions.mode == "scale"
        return pb.RegisterReply(
            session_id=session.id,
            bundle=served.name,
            policy_version=served.version,
            action_set=[] if scale else [int(a) for a in actions.steps],
            next_seq=next_seq,
            action_mode=actions.mode,
            action_factors=[float(a) for a in actions.steps] if scale else [],
            schema_version=meta.schema_version,
        )

    def Report(self, request: pb.ReportRequest, context) -> pb.Decision:
        with self._lock:
            session = self._sessions.get(request.session_id)
        if session is None:
            return self._refuse(
                context,
                grpc.StatusCode.NOT_FOUND,
                "unknown session (expired or the service restarted)",
                "Report",
                None,
            )
        with session.lock:
            session.last_seen = self.clock()
            if session.last is not None and request.seq == session.last.seq:
                self.stats["replayed"] += 1
                out = pb.Decision()
                out.CopyFrom(session.last)
                out.replayed = True
                return out
            if request.seq != session.next_seq:
                return self._refuse(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"seq: expected {session.next_seq} (or {session.next_seq - 1} to retry), got {request.seq}",
                    "Report",
                    session.job_id,
                )
            if session.ended:  # at its target or time budget: a job that trains on decides alone
                return self._refuse(
                    context,
                    grpc.StatusCode.OUT_OF_RANGE,
                    "the job has ended (its target or time budget was reached)",
                    "Report",
                    session.job_id,
                )
            try:
                report = report_from_proto(request.report, session.spec)
                current = batches_from_proto("current_batch", request.current_batch, session.spec)
            except FieldError as e:
                return self._refuse(
                    context, grpc.StatusCode.INVALID_ARGUMENT, str(e), "Report", session.job_id
                )
            try:
                t0 = time.perf_counter()
                out = self._decide(session, request.seq, report, current)
                self.decide_s.append(time.perf_counter() - t0)
                return out
            except Exception:  # a defect must cost one call, never the service
                log.exception("decision for job %s seq %d failed", session.job_id, request.seq)
                return self._refuse(
                    context,
                    grpc.StatusCode.INTERNAL,
                    "internal error; see the service log",
                    "Report",
                    session.job_id,
                )

    def _decide(self, session: Session, seq: int, report, current: np.ndarray) -> pb.Decision:
        served = self.store.get(session.policy_name)
        step = session.step
        step.reward = served.reward  # the serving version's (the learner may have swapped it)
        seen = step.observe(report)
        terminated, time_up = seen.terminated, seen.truncated
        masks = None
        if served.bundle.meta.algorithm == "maskable_ppo":  # the legal steps, as in its training env
            masks = step.masks(current)
        with served.lock:
            out = policy_forward(
                served.bundle, seen.obs, session.spec.num_workers, masks, self.config.explore, session.rng
            )
        session.input_range.bundle = served.bundle  # the serving version's statistics
        out_of_range = session.input_range.count(out.rows)
        new = step.act(out.actions, current).batches
        decision = pb.Decision(seq=seq, local_batch=new.tolist(), policy_version=served.version)
        session.last = decision
        session.next_seq = seq + 1
        session.decisions += 1
        session.versions[served.version] += 1
        digits = self.config.log_obs_digits
        record = {
            "kind": "decision",
            "job": session.job_id,
            "session": session.id,
            "task": session.task,
            "bundle": served.name,
            "seq": seq,
            "version": served.version,
            "t": time.time(),
            "obs": np.round(out.rows.astype(np.float64), digits).tolist(),
            "action": out.actions.tolist(),
            "value": np.round(out.values.astype(np.float64), 6).tolist(),
            "log_prob": np.round(out.log_probs, 6).tolist(),
            **({} if masks is None else {"mask": masks.astype(int).tolist()}),
            "reward": None if seen.reward is None else float(seen.reward),
            "val_accuracy": float(report.val_accuracy),
            "wall_time_s": float(report.wall_time_s),
            "done": terminated or time_up,
            "out_of_range": out_of_range,
        }
        self.log.append(record)
        self.stats["decisions"] += 1
        if self.learner is not None:
            self.learner.observe(record)
        if terminated or time_up:
            self._end(session, report.wall_time_s, terminated)
        return decision

    def _end(self, session: Session, wall_time_s: float, reached: bool) -> None:
        session.ended = True
        version = session.versions.most_common(1)[0][0] if session.versions else 0
        # The benchmark's one score: time to accuracy, or the time budget where the target was missed.
        tta = run_score_s(reached, wall_time_s, session.spec.time_budget_s)
        record = {
            "kind": "end",
            "job": session.job_id,
            "session": session.id,
            "task": session.task,
            "bundle": session.policy_name,
            "version": version,
            "pure": len(session.versions) == 1,
            "tta_s": tta if math.isfinite(tta) else None,
            "reached": reached,
            "decisions": session.decisions,
            "inputs_out_of_range": session.input_range.text(),
            "t": time.time(),
        }
        mostly = session.input_range.entries(at_least=0.5)
        if mostly:  # as PPOController warns for an in-process episode
            log.warning(
                "job %s: bundle %s read inputs %g+ standard deviations from its training mean at half its "
                "decisions or more: %s; the policy extrapolates on this job",
                session.job_id,
                session.policy_name,
                session.input_range.sd,
                ", ".join(mostly),
            )
        self.log.append(record)
        self.stats["jobs_ended"] += 1
        if self.learner is not None:
            self.learner.job_end(record)

    def Close(self, request: pb.CloseRequest, context) -> pb.CloseReply:
        with self._lock:
            session = self._sessions.get(request.session_id)
        if session is None:
            return self._refuse(context, grpc.StatusCode.NOT_FOUND, "unknown session", "Close", None)
        with session.lock:
            if request.HasField("final_report") and not session.ended:
                try:
                    report = report_from_proto(request.final_report, session.spec)
                except FieldError as e:
                    return self._refuse(
                        context, grpc.StatusCode.INVALID_ARGUMENT, str(e), "Close", session.job_id
                    )
                self._finish(session, report)
        with self._lock:
            self._sessions.pop(request.session_id, None)
        return pb.CloseReply(decisions=session.decisions)

    def _finish(self, session: Session, report) -> None:
        """The job's last interval (no decision follows): its reward closes the last transition."""
        served = self.store.get(session.policy_name)
        session.step.reward = served.reward
        seen = session.step.observe(report)
        reached, reward = seen.terminated, seen.reward
        record = {
            "kind": "final",
            "job": session.job_id,
            "session": session.id,
            "task": session.task,
            "bundle": served.name,
            "seq": session.next_seq,
            "version": served.version,
            "t": time.time(),
            "value": [],
            "reward": None if reward is None else float(reward),
            "val_accuracy": float(report.val_accuracy),
            "wall_time_s": float(report.wall_time_s),
            "done": True,
        }
        self.log.append(record)
        if self.learner is not None:
            self.learner.observe(record)
        self._end(session, report.wall_time_s, reached)

    def summary(self) -> dict[str, Any]:
        """Counters, and the in-service decision time's percentiles (ms)."""
        out: dict[str, Any] = dict(self.stats)
        if self.decide_s:
            ms = np.array(self.decide_s) * 1e3
            out["decide_ms"] = {q: float(np.percentile(ms, int(q[1:]))) for q in ("p50", "p99")}
            out["decide_ms"]["max"] = float(ms.max())
        return out

    def close(self) -> None:
        self.log.close()
