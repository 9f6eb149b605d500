"""The PPO trainer's settings, typed: :class:`TrainConfig` and its warm start, :class:`ExpertPretrainConfig`.

The Hydra app (``python -m experiments.train``, ``conf/train.yaml``) builds a :class:`TrainConfig`
with :meth:`TrainConfig.from_mapping`, which checks the composed configuration against these
dataclasses (OmegaConf's structured configs): a key that is not a field, in the top level or in
``expert_pretrain``, or a value of the wrong type, is an error naming it. The keyword groups handed
to other libraries are checked against what those take: ``ppo`` against the algorithm's
constructor, ``env`` against :class:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv`'s,
``domain`` against :class:`~dynamix_gym.envs.randomized.DomainRandomization`'s fields.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dynamix_gym.learning.wallclock import WallClockLimit
from sim.validation import check_choice

#: What :attr:`TrainConfig.obs_form` takes.
OBS_FORMS = ("per_worker", "centralised")
#: What :attr:`TrainConfig.algorithm` takes.
ALGORITHMS = ("ppo", "maskable_ppo")
#: What :attr:`TrainConfig.vec_env` takes: one env per cluster (``PerWorkerVecEnv``) or every
#: cluster in one batched simulator (``BatchedPerWorkerVecEnv``).
VEC_ENVS = ("per_cluster", "batched")
#: The discrete action modes a policy can be trained in.
TRAIN_ACTION_MODES = ("delta", "scale")

#: The PPO settings a fine-tuning run may change on the loaded bundle (conf/ppo/default.yaml's).
FINETUNE_PPO_KEYS = frozenset(
    ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range", "ent_coef",
     "vf_coef", "max_grad_norm")
)  # fmt: skip


def structured(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """``values`` as an instance of the dataclass ``cls``, checked by OmegaConf's structured config:
    a key that is not a field, or a value of another type, raises ValueError naming ``where.key``."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), dict(values))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        first = str(exc).splitlines()[0]
        names = [f.name for f in dataclasses.fields(cls)]
        raise ValueError(f"{where}{'.' + key if key else ''}: {first}; {where} takes {names}") from None


@dataclass
class ExpertPretrainConfig:
    """The behaviour-cloning warm start of a fresh policy (``TrainConfig.expert_pretrain``; see
    :mod:`dynamix_gym.learning.imitation` and :mod:`dynamix_gym.learning.warm_start`)."""

    expert: str = "oracle"  # a controller registry key
    expert_kwargs: dict[str, Any] = field(default_factory=dict)  # the expert's parameters
    episodes: int = 120  # expert episodes over the training worlds
    epochs: int = 20
    learning_rate: float = 1e-3
    dagger_rounds: int = 0  # DAgger: the learner acts, the expert labels, retrain on everything
    dagger_episodes: int | None = None  # per round; None: ``episodes``
    episode_weighting: bool = False  # every episode one share of the loss, not every decision
    # the observation normaliser's statistics over the expert's rows: every decision alike ("decision":
    # long runs set them, and a short run's features land far out) or every episode alike ("episode")
    obs_stats_weighting: str = "decision"
    cache_dir: str | None = None  # keep the expert's own rollouts there, keyed by what they depend on
    # Keep cloning during PPO: bc_steps minibatch steps of bc_coef x the cross-entropy after every
    # rollout (the DAPG-style augmented loss; 0: off), minibatches of bc_batch_size.
    bc_coef: float = 0.0
    bc_steps: int = 10
    bc_batch_size: int = 1024

    def __post_init__(self) -> None:
        if self.obs_stats_weighting not in ("decision", "episode"):
            raise ValueError(
                f"expert_pretrain.obs_stats_weighting must be 'decision' or 'episode', got {self.obs_stats_weighting!r}"
            )
        if not 0.0 <= float(self.bc_coef) <= 100.0:
            raise ValueError(f"expert_pretrain.bc_coef must lie in [0, 100], got {self.bc_coef}")
        if self.bc_coef > 0 and int(self.bc_steps) < 1:
            raise ValueError(f"expert_pretrain.bc_steps must be >= 1, got {self.bc_steps}")
        for name in ("episodes", "epochs", "bc_batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"expert_pretrain.{name} must be >= 1, got {getattr(self, name)}")
        if int(self.dagger_rounds) < 0:
            raise ValueError(f"expert_pretrain.dagger_rounds must be >= 0, got {self.dagger_rounds}")
        if self.dagger_episodes is not None and int(self.dagger_episodes) < 1:
            raise ValueError(f"expert_pretrain.dagger_episodes must be >= 1, got {self.dagger_episodes}")
        if not float(self.learning_rate) > 0:
            raise ValueError(f"expert_pretrain.learning_rate must be > 0, got {self.learning_rate}")

    @property
    def episodes_per_dagger_round(self) -> int:
        return int(self.dagger_episodes if self.dagger_episodes is not None else self.episodes)

    @classmethod
    def from_any(cls, value: ExpertPretrainConfig | Mapping[str, Any] | None) -> ExpertPretrainConfig | None:
        """None, an instance, or a mapping of its fields (an unknown key is an error naming it)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"expert_pretrain must be a mapping of {[f.name for f in dataclasses.fields(cls)]} or null, got {value!r}"
            )
        return structured(cls, value, "expert_pretrain")


@dataclass
class TrainConfig:
    """Everything :func:`dynamix_gym.learning.training.train` needs. The defaults are the library's;
    ``conf/train.yaml`` (checked against these fields by :meth:`from_mapping`) sets the app's. The
    dict fields default to empty, i.e. the libraries' own defaults, where the app fills them from
    its groups (``conf/ppo``, ``conf/domain``, ``conf/reward``)."""

    run_dir: str
    seed: int = 0
    total_timesteps: int = 300_000
    obs_form: str = "per_worker"  # or "centralised"
    algorithm: str = "ppo"  # or "maskable_ppo" (sb3-contrib's MaskablePPO: illegal steps masked)
    action_mode: str = "delta"  # or "scale" (multiplicative steps); both discrete
    cluster_sizes: tuple[int, ...] = (4, 6, 8)  # one training cluster per entry
    centralised_workers: int = 8
    centralised_envs: int = 4
    subprocess: bool = False
    # "per_cluster" (one HeteroClusterEnv per training cluster) or "batched" (per-worker form only:
    # batched_copies clusters of each size in cluster_sizes, all in one batched simulator,
    # dynamix_gym.envs.batched_per_worker; same worlds and rules, fixed time scale, no subprocess).
    vec_env: str = "per_cluster"
    batched_copies: int = 4
    domain: dict[str, Any] = field(default_factory=dict)  # DomainRandomization fields (workers set per env)
    env: dict[str, Any] = field(default_factory=dict)  # HeteroClusterEnv kwargs (reward, interval, ...)
    ppo: dict[str, Any] = field(default_factory=dict)  # stable_baselines3.PPO kwargs
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    normalize_obs: bool = True
    normalize_reward: bool = True
    # Keep the observation statistics a policy was pretrained with (a warm start's expert data, a
    # fine-tuned bundle's) fixed during PPO: running updates move the inputs the pretrained policy
    # reads, e.g. its rare regime flags, and can undo it before PPO has learned anything.
    freeze_obs_norm: bool = False
    # The time reward's scale in the training worlds: "fixed" (the reward's time_scale_s) or
    # "world" (each world's own time scale, so that every world's return reads near -1; see
    # RandomizedClusterEnv). Validation and evaluation measure minutes either way.
    time_scale: str = "fixed"
    # Timesteps at the start of PPO during which only the value function learns (the policy's
    # actor frozen): a fine-tuned or warm-started actor meets a critic fitted to another reward or
    # input first, whose advantages are noise until it has caught up.
    critic_warmup_steps: int = 0
    # "local" (the critic reads the worker's row, as the actor does) or "centralised" (MAPPO-style:
    # the row plus the cluster's state; the actor still reads the row alone; per-worker form only,
    # fresh or finetune_from a local-critic bundle; dynamix_gym.learning.central_critic).
    critic: str = "local"
    torch_threads: int = 1
    checkpoint_every: int = 50_000  # timesteps
    eval_every: int = 50_000  # timesteps
    eval_scenarios: tuple[str, ...] = ("static_hetero", "throttle", "mixed")
    eval_seeds: tuple[int, ...] = (1000, 1001)
    eval_workers: int = 8
    # Validation tasks instead of eval_scenarios (e.g. held-out tasks of the benchmark's train split,
    # dynamix_gym.benchmark.validation_tasks): each {"name", "cluster", "workload", "scenario",
    # "interval"} with sim specs; every task runs at every seed of eval_seeds.
    eval_tasks: tuple[Any, ...] = ()
    progress_bar: bool = True
    resume: bool = True  # continue from the newest checkpoint in run_dir/checkpoints if any
    # start from this bundle instead of a fresh policy (with expert_pretrain: DAgger from its weights,
    # its observation statistics kept, then PPO)
    finetune_from: str | None = None
    # wall-clock bound of the warm start's DAgger rounds and the PPO updates together, from the
    # start of the run (None: total_timesteps and the rounds alone)
    max_train_s: float | None = None
    # Behaviour-cloning warm start of a fresh policy from an expert controller (None: off), e.g.
    # {"expert": "oracle", "episodes": 120, "epochs": 20}: an ExpertPretrainConfig or its mapping.
    expert_pretrain: ExpertPretrainConfig | None = None

    def __post_init__(self) -> None:
        self.expert_pretrain = ExpertPretrainConfig.from_any(self.expert_pretrain)
        for name in ("cluster_sizes", "eval_scenarios", "eval_seeds", "eval_tasks"):
            setattr(self, name, tuple(getattr(self, name)))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainConfig:
        """A config from plain containers (the app's composed config less its own keys), checked
        field by field; ``eval_tasks`` (simulator specs, not config values) is passed through."""
        values = dict(values)
        tasks = values.pop("eval_tasks", ())
        cfg = structured(cls, values, "train")
        return dataclasses.replace(cfg, eval_tasks=tuple(tasks))


def _check_keys(where: str, given: Mapping[str, Any], allowed: set[str], source: str) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a keyword of {source}; it takes {sorted(allowed)}")


def _keywords(fn: Any) -> set[str]:
    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
    } - {"self"}


def check_train_config(cfg: TrainConfig) -> None:
    """Refuse combinations that cannot train, and keyword groups their libraries do not take, naming the field."""
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.envs.randomized import TIME_SCALES, DomainRandomization
    from dynamix_gym.learning.central_critic import CRITICS
    from dynamix_gym.learning.training import algorithm_class

    algo = algorithm_class(cfg.algorithm)
    check_choice("obs_form", cfg.obs_form, OBS_FORMS)
    check_choice("time_scale", cfg.time_scale, TIME_SCALES)
    check_choice("vec_env", cfg.vec_env, VEC_ENVS)
    if (
        isinstance(cfg.batched_copies, bool)
        or not isinstance(cfg.batched_copies, int)
        or cfg.batched_copies < 1
    ):
        raise ValueError(f"batched_copies must be an integer >= 1, got {cfg.batched_copies!r}")
    if cfg.vec_env == "batched":
        for bad, why in (
            (cfg.obs_form != "per_worker", f"obs_form=per_worker, got {cfg.obs_form!r}"),
            (cfg.time_scale != "fixed", f"time_scale=fixed (the per-world scale reads the oracle), got {cfg.time_scale!r}"),
            (cfg.subprocess, "subprocess=false (one process holds the batch)"),
        ):  # fmt: skip
            if bad:
                raise ValueError(f"vec_env=batched needs {why}")
        from dynamix_gym.envs.batched_core import BatchedClusters

        _check_keys("env", cfg.env, _keywords(BatchedClusters.__init__) - {"num_envs", "worlds", "world", "domain"},
                    "BatchedClusters (vec_env=batched)")  # fmt: skip
    if cfg.max_train_s is not None:
        WallClockLimit(cfg.max_train_s)  # its range check
    check_choice("critic", cfg.critic, CRITICS)
    expert = cfg.expert_pretrain
    if cfg.freeze_obs_norm and not (cfg.normalize_obs and (cfg.finetune_from or expert)):
        raise ValueError(
            "freeze_obs_norm=true keeps pretrained observation statistics: it needs normalize_obs=true and "
            "finetune_from or expert_pretrain (a fresh policy has none to keep)"
        )
    if cfg.critic == "centralised":
        if cfg.obs_form != "per_worker":
            raise ValueError(
                "critic=centralised needs obs_form=per_worker (a shared actor on each worker's row)"
            )
        if expert:
            raise ValueError(
                "critic=centralised cannot be warm-started by expert_pretrain (its rows carry no cluster "
                "state); warm-start a local-critic run, then finetune_from its bundle with critic=centralised"
            )
    if cfg.critic_warmup_steps < 0:
        raise ValueError(f"critic_warmup_steps must be >= 0, got {cfg.critic_warmup_steps}")
    if cfg.action_mode not in TRAIN_ACTION_MODES:
        raise ValueError(
            f"action_mode must be 'delta' or 'scale' (the discrete modes), got {cfg.action_mode!r}"
        )
    if cfg.algorithm == "maskable_ppo" and cfg.obs_form != "per_worker":
        raise ValueError("algorithm=maskable_ppo needs obs_form=per_worker (one masked step per worker)")
    _check_keys("ppo", cfg.ppo, _keywords(algo.__init__) - {"policy", "env"}, algo.__name__)
    _check_keys("env", cfg.env, _keywords(HeteroClusterEnv.__init__), "HeteroClusterEnv")
    domain_fields = {f.name for f in dataclasses.fields(DomainRandomization)} - {"workers"}
    _check_keys("domain", cfg.domain, domain_fields, "DomainRandomization (workers come from cluster_sizes)")
