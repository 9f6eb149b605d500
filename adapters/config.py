"""Configuration of the real DDP backend (one frozen record, picklable into worker processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.data import DATASETS
from adapters.models import MODELS, NORMS
from adapters.tasks import Task, task_of
from sim.guards import GuardConfig
from sim.scaling import LR_RULES

DIST_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class RealDDPConfig:
    """Everything a :class:`~adapters.ddp_backend.DDPBackend` run needs.

    Batches (``min_batch``, ``max_batch``, ``initial_batch``, ``base_batch``) are in samples; a
    scalar applies to every worker. ``max_batch`` is the memory cap the env clips actions to;
    ``memory_batch`` (tests, CPU demos) makes a rank raise an out-of-memory error above that batch,
    as a GPU would. ``guards`` (:class:`sim.guards.GuardConfig`) cap and ramp the learning rate the
    ``lr_rule`` sets and watch for divergence, rolling back to the last good state when it fires.

    The data set decides the task (:mod:`adapters.tasks`) and so which models fit it and which field
    sets the target that ends an episode: ``target_accuracy`` (a classification data set's held-out
    accuracy) or ``target_val_loss`` (``pystdlib``'s held-out loss in nats per byte, a falling
    metric; None: the task's default). ``target_quality`` is the target as the env's rising quality.
    """

    workers: int = 2
    dataset: str = "digits"
    model: str = "cnn"
    norm: str = "group"  # ResNet-18's normalisation (see adapters.models)
    device: str = "cpu"  # "cpu" | "cuda" (all ranks on one device when there is one GPU)
    dist_backend: str = "gloo"
    base_batch: int = 32  # M0
    min_batch: int | tuple[int, ...] = 8
    max_batch: int | tuple[int, ...] = 512
    initial_batch: int | tuple[int, ...] | None = None  # default: base_batch
    memory_batch: tuple[int, ...] | None = None
    base_lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_rule: str = "adascale"
    noise_smoothing: float = 0.2
    target_accuracy: float = 0.95  # classification data sets: held-out accuracy that ends the episode
    target_val_loss: float | None = None  # pystdlib: held-out loss (nats per byte) that ends it; None: 2.3
    time_budget_s: float = 600.0
    scenario: object = None  # sim.faults.Scenario or a preset name; None: no faults
    emulate: tuple[str, ...] | None = None  # GPU type per worker to emulate, e.g. ("T4", "V100")
    emulate_app: str = "cifar10"
    fault_time_scale: float = 1.0
    val_fraction: float = 0.2
    split_seed: int = 0
    timeout_s: float = 60.0  # collective timeout: a hung rank is reported within it
    start_timeout_s: float = 180.0  # spawning + importing torch + joining the group
    threads_per_worker: int = 1
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # intervals between checkpoints (0: never)
    resume: bool = False
    record_indices: bool = False  # debug/tests: workers return the sample indices they trained on
    #: the guards (sim.guards.GuardConfig, or a mapping of its fields, or a mode name): capped and
    #: ramped learning rate, divergence watchdog with rollback; on ("act") by default
    guards: GuardConfig | dict | str | None = None
    #: a calibrated profile (sim.profile reference) whose compute model of these ranks gives the spec's
    #: compute curve (BackendSpec.compute_curve_s, read by observation schema 4); the quick calibration
    #: sets its refit. None: no curve (schema 1-3 bundles need none)
    compute_profile: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "guards", GuardConfig.from_any(self.guards))
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {self.workers!r}")
        for name, value, choices in (
            ("dataset", self.dataset, DATASETS),
            ("model", self.model, MODELS),
            ("norm", self.norm, NORMS),
            ("device", self.device, ("cpu", "cuda")),
            ("dist_backend", self.dist_backend, DIST_BACKENDS),
            ("lr_rule", self.lr_rule, LR_RULES),
        ):
            if value not in choices:
                raise ValueError(f"{name}={value!r} is not one of {list(choices)}")
        if self.dist_backend == "nccl" and self.device != "cuda":
            raise ValueError("dist_backend='nccl' needs device='cuda'; use gloo on CPU")
        if self.base_batch < 1:
            raise ValueError(f"base_batch (M0) must be >= 1, got {self.base_batch}")
        if self.base_lr <= 0:
            raise ValueError(f"base_lr must be > 0, got {self.base_lr}")
        if self.timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be > 0")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise ValueError("checkpoint_every / resume need checkpoint_dir")
        if not 0.0 < self.target_accuracy <= 1.0:
            raise ValueError(f"target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        self._check_task()
        if self.memory_batch is not None and len(self.memory_batch) != self.workers:
            raise ValueError(f"memory_batch needs {self.workers} entries, got {len(self.memory_batch)}")

    def _check_task(self) -> None:
        task = self.task
        if self.model not in task.models:
            raise ValueError(
                f"model={self.model!r} does not fit dataset={self.dataset!r} ({task.name} task): "
                f"choose one of {list(task.models)}"
            )
        if task.target_field != "target_val_loss" and self.target_val_loss is not None:
            raise ValueError(
                f"target_val_loss applies to a language-modelling dataset (pystdlib); dataset={self.dataset!r} "
                f"is a {task.name} task: set its target with {task.target_field}"
            )
        if task.target_field == "target_val_loss":
            untrained = task.metric.untrained
            value = self.target_val_loss
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < untrained
            ):
                raise ValueError(
                    f"target_val_loss must be in [0, {untrained:.4f}) nats per byte (below an untrained "
                    f"model's ln 256; 0: never reached), got {value!r}"
                )

    @property
    def task(self) -> Task:
        """The task of ``dataset`` (:mod:`adapters.tasks`)."""
        return task_of(self.dataset)

    @property
    def target(self) -> float:
        """The target in the task's metric units (``target_accuracy`` or ``target_val_loss``)."""
        value = getattr(self, self.task.target_field)
        return float(self.task.default_target if value is None else value)

    @property
    def target_quality(self) -> float:
        """The target as the env's rising quality (:class:`sim.workloads.QualityMetric`)."""
        return float(self.task.metric.to_quality(self.target))

    def per_worker(self, value: int | tuple[int, ...] | None, name: str) -> tuple[int, ...]:
        if value is None:
            value = self.base_batch
        if isinstance(value, int):
            return (int(value),) * self.workers
        out = tuple(int(v) for v in value)
        if len(out) != self.workers:
            raise ValueError(f"{name} lists {len(out)} batches for {self.workers} workers")
        return out


def real_config_of(profile: Any) -> dict[str, Any]:
    """The real backend config (:class:`RealDDPConfig` fields) a calibrated profile
    (:class:`sim.profile.ClusterProfile`) was measured on: its ``provenance.real_config``.

    Raises:
        ValueError: a profile not measured on the real backend.
    """
    real_config = dict((profile.meta.get("provenance") or {}).get("real_config") or {})
    if not real_config:
        raise ValueError(
            f"profile {profile.name!r} was not measured on the real backend (no provenance.real_config)"
        )
    return real_config
