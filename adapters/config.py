"""Configuration of the real DDP backend (one frozen record, picklable into worker processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.data import DATASETS
from adapters.models import MODELS, NORMS
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
    target_accuracy: float = 0.95
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
        if self.memory_batch is not None and len(self.memory_batch) != self.workers:
            raise ValueError(f"memory_batch needs {self.workers} entries, got {len(self.memory_batch)}")

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
