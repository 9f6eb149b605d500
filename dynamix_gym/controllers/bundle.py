"""Policy bundles: a trained PPO policy with everything needed to drive a cluster safely.

A bundle is a directory::

    bundle.json          schema version + feature names, action mode and set, observation form,
                         training config and metadata
    model.zip            the Stable-Baselines3 PPO model (or sb3-contrib MaskablePPO's: ``algorithm``)
    obs_norm.npz         observation normalisation statistics (VecNormalize's running mean / var)

Loading a bundle yields a controller that evaluation and deployment use like any baseline. A
bundle whose observation schema (version and feature names), action mode or action set differs
from the env's is refused with :class:`BundleMismatchError`: a policy must never be fed features
it was not trained on. Schema 1 bundles (every bundle written before schema 2) load unchanged: a
bundle.json without ``action_mode`` is a ``delta`` bundle.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dynamix_gym.actions import DEFAULT_SPLIT_TOLERANCE, check_in_range, check_split, step_masks
from dynamix_gym.controllers.base import BaseController
from dynamix_gym.decision import policy_forward
from dynamix_gym.obs import DEFAULT_SCHEMA_VERSION, SCHEMA_VERSIONS, get_schema
from sim.protocol import BackendSpec
from sim.validation import check_range

log = logging.getLogger(__name__)

BUNDLE_FORMAT = 1
OBS_FORMS = ("per_worker", "centralised")
#: The env action modes a bundle's policy may emit (discrete steps: deltas or factors).
BUNDLE_ACTION_MODES = ("delta", "scale")
#: The algorithm whose ``load`` reads model.zip; ``maskable_ppo`` policies get the legal steps.
BUNDLE_ALGORITHMS = ("ppo", "maskable_ppo")


class BundleMismatchError(ValueError):
    """The bundle was trained for a different observation schema, action set or cluster size."""


@dataclass
class BundleMeta:
    obs_form: str  # "per_worker" or "centralised"
    action_set: list[float]  # batch deltas (delta mode) or factors (scale mode)
    num_workers: int | None = None  # centralised bundles only: the cluster size they drive
    schema_version: str = DEFAULT_SCHEMA_VERSION
    #: per-worker feature names of ``schema_version`` (filled from the schema when omitted)
    feature_names: list[str] | None = None
    bundle_format: int = BUNDLE_FORMAT
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    action_mode: str = "delta"
    algorithm: str = "ppo"
    #: how the env turned the policy's batches into the ones that ran (``SPLIT_MODES``); bundles
    #: written before the balanced split were all ``policy``
    split: str = "policy"
    split_tolerance: float = DEFAULT_SPLIT_TOLERANCE
    #: what the critic read in training (``local``: the worker's row; ``centralised``: the row plus
    #: the cluster's state, :mod:`dynamix_gym.learning.central_critic`); the actor reads the row
    critic: str = "local"

    def __post_init__(self) -> None:
        self.split, self.split_tolerance = check_split(self.split, self.split_tolerance)
        if self.critic not in ("local", "centralised"):
            raise ValueError(f"critic must be 'local' or 'centralised', got {self.critic!r}")
        if self.critic == "centralised" and self.obs_form != "per_worker":
            raise ValueError("a centralised critic belongs to a per-worker bundle (obs_form per_worker)")
        if self.obs_form not in OBS_FORMS:
            raise ValueError(f"obs_form must be one of {OBS_FORMS}, got {self.obs_form!r}")
        if self.action_mode not in BUNDLE_ACTION_MODES:
            raise ValueError(f"action_mode must be one of {BUNDLE_ACTION_MODES}, got {self.action_mode!r}")
        if self.algorithm not in BUNDLE_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {BUNDLE_ALGORITHMS}, got {self.algorithm!r}")
        self.schema_version = str(self.schema_version)
        if self.feature_names is None and self.schema_version in SCHEMA_VERSIONS:
            self.feature_names = get_schema(self.schema_version).per_worker_names()
        if self.obs_form == "centralised" and not self.num_workers:
            raise ValueError("a centralised bundle must record num_workers")


@dataclass
class ObsNorm:
    """VecNormalize's observation statistics: obs' = clip((obs - mean) / sqrt(var + eps), +-clip)."""

    mean: np.ndarray
    var: np.ndarray
    clip: float = 10.0
    epsilon: float = 1e-8

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        out = (obs - self.mean) / np.sqrt(self.var + self.epsilon)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    @classmethod
    def from_vecnormalize(cls, venv) -> ObsNorm:
        return cls(
            np.asarray(venv.obs_rms.mean, dtype=np.float64).copy(),
            np.asarray(venv.obs_rms.var, dtype=np.float64).copy(),
            float(venv.clip_obs),
            float(venv.epsilon),
        )


def save_bundle(path: str | Path, model, meta: BundleMeta, obs_norm: ObsNorm | None) -> Path:
    """Write a bundle directory atomically: built in a temporary sibling, then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save(tmp / "model.zip")
        if obs_norm is not None:
            np.savez(
                tmp / "obs_norm.npz",
                mean=obs_norm.mean,
                var=obs_norm.var,
                clip=obs_norm.clip,
                epsilon=obs_norm.epsilon,
            )
        (tmp / "bundle.json").write_text(
            json.dumps(meta.__dict__, indent=2, sort_keys=True, default=_jsonable) + "\n"
        )
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


@dataclass
class PolicyBundle:
    path: Path
    meta: BundleMeta
    model: Any  # stable_baselines3.PPO or sb3_contrib.MaskablePPO (meta.algorithm)
    obs_norm: ObsNorm | None


def load_bundle(path: str | Path, device: str = "cpu") -> PolicyBundle:
    """Load a bundle directory (or a ``policy.zip`` inside one); clear errors for what is missing."""
    from stable_baselines3 import PPO

    path = Path(path)
    if path.is_file() and path.suffix == ".zip":
        path = path.parent
    meta_file = path / "bundle.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{path} is not a policy bundle: {meta_file.name} is missing")
    raw = json.loads(meta_file.read_text())
    if raw.get("bundle_format") != BUNDLE_FORMAT:
        raise BundleMismatchError(
            f"{path}: bundle format {raw.get('bundle_format')!r}, this version reads format {BUNDLE_FORMAT}"
        )
    meta = BundleMeta(**raw)
    if meta.schema_version not in SCHEMA_VERSIONS:
        raise BundleMismatchError(
            f"{path} was trained on observation schema {meta.schema_version!r}; this version encodes "
            f"schemas {list(SCHEMA_VERSIONS)}. Retrain or fine-tune the policy for one of them."
        )
    schema = get_schema(meta.schema_version)
    if meta.feature_names != schema.per_worker_names():
        raise BundleMismatchError(
            f"{path} records observation schema {meta.schema_version!r} with {len(meta.feature_names or [])} "
            f"per-worker features that differ from that schema's {schema.per_worker_dim} "
            f"({schema.per_worker_names()[:3]} ...). Retrain or fine-tune the policy for this schema."
        )
    if meta.algorithm == "maskable_ppo":
        from sb3_contrib import MaskablePPO

        model = MaskablePPO.load(path / "model.zip", device=device)
    else:
        model = PPO.load(path / "model.zip", device=device)
    norm = None
    if (path / "obs_norm.npz").is_file():
        z = np.load(path / "obs_norm.npz")
        norm = ObsNorm(z["mean"], z["var"], float(z["clip"]), float(z["epsilon"]))
    return PolicyBundle(path, meta, model, norm)


class PPOController(BaseController):
    """A trained PPO bundle as a controller (the bundle's action mode: ``delta``, or ``scale``).

    The env it drives must encode the bundle's observation schema (``obs_schema``) and use its
    action mode and set; :meth:`check_env` (run by :func:`dynamix_gym.evaluation.run_episode`)
    refuses any other with :class:`BundleMismatchError`.

    Args:
        path: bundle directory (or its ``model.zip``).
        bundle: an already loaded bundle (instead of ``path``).
        deterministic: take the most likely action (default) rather than sampling one (with the
            generator :meth:`reset` was given).
        split: run the policy under this split (``"policy"`` or ``"balanced"``, see
            :class:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv`) rather than the one it was
            trained under (``None``, the default: the bundle's); an ablation knob.
        split_tolerance: the balanced split's tolerance (``None``: the bundle's).
        out_of_range_sd: an input whose normalised value lies this many standard deviations or more
            from the bundle's training mean is counted as out of range at that decision (the episode's
            summary lists them, ``inputs_out_of_range``; at most the normaliser's clip, 10).
        opening: every worker's local batch in the warm-up interval, before the policy's first
            decision (``None``, the default: the backend's initial batch, the job's own). ``deploy
            finetune=true`` sets it when the fine-tune chose an opening in the refitted simulator
            (:mod:`experiments.deploy_finetune`); a batch outside a worker's range is refused at reset.
    """

    name: ClassVar[str] = "ppo"
    action_mode: ClassVar[str] = "delta"
    uses_truth: ClassVar[bool] = False

    def __init__(
        self,
        path: str | Path | None = None,
        bundle: PolicyBundle | None = None,
        deterministic: bool = True,
        split: str | None = None,
        split_tolerance: float | None = None,
        out_of_range_sd: float = 6.0,
        opening: int | None = None,
    ):
        self.out_of_range_sd = check_range("out_of_range_sd", out_of_range_sd, 0.0, low_open=True)
        if opening is not None and (
            isinstance(opening, bool) or not isinstance(opening, int | np.integer) or opening < 1
        ):
            raise ValueError(
                f"opening (the warm-up interval's local batch) must be an integer >= 1 or None, got {opening!r}"
            )
        self.opening = None if opening is None else int(opening)
        if bundle is None:
            if path is None:
                raise ValueError("PPOController needs a bundle path (controller.path=<bundle dir>)")
            bundle = load_bundle(path)
        self.bundle = bundle
        self.deterministic = deterministic
        self.action_set = [float(a) for a in bundle.meta.action_set]
        self.action_mode = bundle.meta.action_mode
        self.schema = get_schema(bundle.meta.schema_version)
        self.split, self.split_tolerance = check_split(
            bundle.meta.split if split is None else split,
            bundle.meta.split_tolerance if split_tolerance is None else split_tolerance,
        )
        #: the inputs of this episode that lay ``out_of_range_sd`` or more from the training mean, per
        #: decision (the policy extrapolated there); reset() starts it again for the spec's workers
        self.input_range = InputRange(bundle, bundle.meta.num_workers or 1, self.out_of_range_sd)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.input_range = InputRange(self.bundle, spec.num_workers, self.out_of_range_sd)
        meta = self.bundle.meta
        if meta.obs_form == "centralised" and meta.num_workers != spec.num_workers:
            raise BundleMismatchError(
                f"{self.bundle.path} is a centralised policy for {meta.num_workers} workers; this cluster "
                f"has {spec.num_workers}. Use a per-worker bundle to drive other cluster sizes."
            )

    def env_options(self) -> dict[str, Any]:
        """What an env must be built with for this policy: its schema, action set and split (see
        :func:`dynamix_gym.controllers.base.env_options`)."""
        out: dict[str, Any] = {"obs_schema": int(self.schema.version), "action_set": _fmt(self.action_set)}
        if self.split != "policy":  # envs that predate the split take no such argument
            out.update(split=self.split, split_tolerance=self.split_tolerance)
        return out

    def initial_batches(self, spec: BackendSpec) -> np.ndarray | None:
        """The warm-up interval's local batches: ``opening`` on every worker, or None (the backend's)."""
        if self.opening is None:
            return None
        return check_in_range(np.full(spec.num_workers, self.opening), spec, "opening")

    def check_env(self, env) -> None:
        """Refuse an env whose observation schema, action mode or action set differs from the
        policy's."""
        env_schema = getattr(env, "obs_schema", None)
        env_version = getattr(env_schema, "version", "1")
        if env_version != self.schema.version:
            raise BundleMismatchError(
                f"{self.bundle.path} was trained on observation schema {self.schema.version!r}; the env "
                f"encodes schema {env_version!r}. Build the env with obs_schema={self.schema.version}."
            )
        env_mode = getattr(env, "action_mode", "delta")
        if env_mode != self.action_mode:
            raise BundleMismatchError(
                f"{self.bundle.path} emits {self.action_mode!r} actions; the env is in {env_mode!r} mode"
            )
        env_set = [float(a) for a in env.action_set]
        if env_set != self.action_set:
            kind = "batch factors" if self.action_mode == "scale" else "batch deltas"
            raise BundleMismatchError(
                f"{self.bundle.path} was trained with {kind} {_fmt(self.action_set)}; the env uses "
                f"{_fmt(env_set)}"
            )
        env_split = (getattr(env, "split", "policy"), getattr(env, "split_tolerance", self.split_tolerance))
        if env_split != (self.split, self.split_tolerance):
            raise BundleMismatchError(
                f"{self.bundle.path} runs under split={self.split!r} (tolerance {self.split_tolerance}); the "
                f"env uses split={env_split[0]!r} (tolerance {env_split[1]})"
            )

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool | None = None):
        """Every worker's step: the policy's most likely one (``deterministic``), else one drawn
        with the generator of :meth:`reset` (:func:`dynamix_gym.decision.policy_forward`, the
        service's inference too); a MaskablePPO policy sees the legal steps of the batches in force."""
        det = self.deterministic if deterministic is None else deterministic
        n = self.spec.num_workers
        masks = None
        if self.bundle.meta.algorithm == "maskable_ppo":  # from the batches in force and the spec alone
            masks = step_masks(
                self.action_mode,
                np.asarray(self.action_set),
                info["local_batches"],
                self.spec.min_batch,
                self.spec.max_batch,
            )
        out = policy_forward(self.bundle, observation, n, masks, explore=not det, rng=self.rng)
        self._count_out_of_range(out.rows)
        return out.actions, None

    def _count_out_of_range(self, rows: np.ndarray) -> None:
        self.input_range.count(rows)

    @property
    def inputs_out_of_range(self) -> dict[str, int]:
        """Per input the decisions of this episode at which it lay out of range (:class:`InputRange`)."""
        return self.input_range.counts

    @property
    def decisions_seen(self) -> int:
        return self.input_range.decisions

    def episode_summary(self) -> dict[str, Any]:
        """What :func:`dynamix_gym.evaluation.run_episode` adds to a summary: per input the decisions
        at which it lay ``out_of_range_sd`` or more standard deviations from the bundle's training
        mean (most often first). An input out of range at half the decisions or more is logged as a
        warning: the policy extrapolates on this job (its training rows exceed 6 s.d. in ~1 % of
        decisions per input)."""
        mostly = self._out_of_range_entries(at_least=0.5)
        if mostly:
            log.warning(
                "%s read inputs %g+ standard deviations from its training mean at half its decisions or "
                "more: %s; the policy extrapolates on this job",
                self.bundle.path,
                self.out_of_range_sd,
                ", ".join(mostly),
            )
        return {"inputs_out_of_range": self.out_of_range_text()}

    def _out_of_range_entries(self, at_least: float = 0.0) -> list[str]:
        return self.input_range.entries(at_least)

    def out_of_range_text(self) -> str:
        """The episode's inputs out of range so far, most often first (``"name (k of n); ..."``; empty
        when none), without logging: what the drop-in's closing line reads."""
        return self.input_range.text()


class InputRange:
    """Per input of a bundle's policy, the decisions at which some worker's normalised value lay ``sd``
    or more standard deviations from the bundle's training mean (the normaliser's clip at most): where
    the policy extrapolates. One per episode or job (the controller's, the arbitrator's sessions').

    Args:
        bundle: the policy bundle (without observation statistics nothing is counted).
        num_workers: the job's workers (a centralised policy's inputs are named per worker).
        sd: the threshold, in standard deviations.
    """

    def __init__(self, bundle: PolicyBundle, num_workers: int, sd: float = 6.0) -> None:
        self.bundle, self.sd = bundle, float(sd)
        schema = get_schema(bundle.meta.schema_version)
        per_worker = bundle.meta.obs_form == "per_worker"
        self.names = schema.per_worker_names() if per_worker else schema.centralised_names(num_workers)
        self.counts: dict[str, int] = {}
        self.decisions = 0

    def count(self, rows: np.ndarray) -> list[str]:
        """Count one decision's normalised input rows (workers x inputs); the inputs out at it."""
        norm = self.bundle.obs_norm
        if norm is None:
            return []
        at = (np.abs(rows) >= min(self.sd, norm.clip) * (1.0 - 1e-6)).any(axis=0)
        self.decisions += 1
        out = []
        for j in np.flatnonzero(at).tolist():
            name = (
                self.names[j] if j < len(self.names) else f"input[{j}]"
            )  # e.g. a centralised critic's state
            self.counts[name] = self.counts.get(name, 0) + 1
            out.append(name)
        return out

    def entries(self, at_least: float = 0.0) -> list[str]:
        """``"name (k of n)"`` for each input out of range at a share ``at_least`` of the decisions
        or more, most often first."""
        seen = self.decisions
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return [f"{k} ({v} of {seen})" for k, v in ranked if v >= at_least * seen]

    def text(self) -> str:
        """``"name (k of n); ..."``, most often first; empty when none."""
        return "; ".join(self.entries())


def _fmt(values: list[float]) -> list[int | float]:
    """Whole numbers as ints (deltas read as in the paper: [-100, -25, 0, 25, 100])."""
    return [int(v) if float(v).is_integer() else v for v in values]
