"""Fine-tune the bundle in the refitted simulator before the run: ``python -m experiments.deploy
finetune=true calibrate.quick=true policy=<bundle>``.

After the quick calibration (:mod:`experiments.deploy_calibration`) wrote ``<run dir>/profile_refit``,
the PPO bundle is fine-tuned (:func:`dynamix_gym.learning.training.train` with ``finetune_from``) in
worlds of that profile shaped like the deploy: the refit's cluster with random static speed gaps
between its workers and one throttling window at the time scale of the job's episode (the bundle's
own time to accuracy on the deploy's scenario at the fine-tune's seed), at the deploy's interval K.
``finetuning.method``:

- ``imitate`` (the default): DAgger from the bundle's own weights (Ross et al., AISTATS 2011): the
  expert the bundle was distilled from (its config's ``expert_pretrain.expert``; the time-to-target
  oracle when it has none) labels the refit worlds' states, first its own, then those the learner
  visits, and the bundle is cloned on them with its observation statistics kept; then
  ``finetuning.timesteps`` PPO steps (0: none; as with ``ppo``).
- ``ppo``: PPO alone for ``finetuning.timesteps`` steps, observation statistics frozen and the
  critic warmed up for the first quarter (the actor frozen while the value function learns the
  refit's returns).

Both are bounded by ``finetuning.max_s`` seconds (no DAgger round and no PPO update starts after
it). Then both bundles run the deploy's scenario in the refitted simulator on held-out seeds
(``finetuning.seeds``: never the bundle's validation seeds nor the fine-tune's). The fine-tuned
bundle is kept only if its mean score there (its time to accuracy, the time budget when a run misses
the target) is lower than the bundle's; else the deploy runs the bundle as it came. ``finetune.json``
in the run dir holds both scores per seed and the verdict; the fine-tuned bundle stays in
``finetune/policy``.

The opening (``finetuning.opening``): the first interval runs at one batch before any decision, and
the job's own batch may be far from a good one (on the real language model a first interval at 32
per rank costs three times one at 8). With ``refit`` (the default) the expert's mean score in the
refit on ``finetuning.opening_seeds`` (disjoint from the held-out ones) is taken from each candidate
local batch (the quick calibration's ladder batches, which the refit has just measured, and the
job's); the fine-tune's worlds start at the best (the job's batch unless another is strictly
faster), the fine-tuned bundle is scored from there against the bundle from the job's batch, and when
kept it is deployed with that opening (:attr:`~dynamix_gym.controllers.bundle.PPOController.opening`).
``job`` keeps the job's batch. Either way the bundle as it came is deployed from the job's batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from dynamix_gym.benchmark.scoring import run_score_s
from dynamix_gym.configs import settings
from dynamix_gym.controllers.base import env_options
from dynamix_gym.controllers.bundle import PPOController, load_bundle
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.learning.training import FINETUNE_PPO_KEYS, TrainConfig, train
from experiments.common import atomic_write_text, shown
from sim.datafiles import dump_json
from sim.profile import load_profile

log = logging.getLogger(__name__)

RECORD_FILE = "finetune.json"
RUN_DIR = "finetune"


METHODS = ("imitate", "ppo")
#: ``finetuning.opening``: where the first interval's batch comes from (module docstring).
OPENINGS = ("refit", "job")


def _whole(value: Any, low: int, high: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


@dataclass(frozen=True)
class Finetuning:
    """``finetuning`` in ``conf/deploy.yaml``; every field is checked with its range."""

    method: str = "imitate"
    max_s: float = 120.0
    timesteps: int = 0  # PPO steps (after the imitation with method=imitate)
    learning_rate: float = 3e-5  # PPO's
    episodes: int = 100  # the expert's own episodes (method=imitate)
    dagger_rounds: int = 3
    dagger_episodes: int = 50  # the learner's per round
    epochs: int = 20  # cloning epochs on the expert's episodes (half as many after each round)
    domain: dict[str, Any] = field(default_factory=dict)  # DomainRandomization fields over the default worlds
    seeds: tuple[int, ...] = (2000, 2001, 2002, 2003, 2004, 2005)
    opening: str = "refit"
    opening_seeds: tuple[int, ...] = (3000, 3001, 3002, 3003, 3004, 3005)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"finetuning.method must be one of {list(METHODS)}, got {self.method!r}")
        ok = not isinstance(self.max_s, bool) and isinstance(self.max_s, int | float)
        if not ok or not 0 < self.max_s <= 3600:
            raise ValueError(f"finetuning.max_s must lie in (0, 3600] seconds, got {self.max_s!r}")
        low = 1 if self.method == "ppo" else 0
        if not _whole(self.timesteps, low, 10**7):
            raise ValueError(
                f"finetuning.timesteps must be an integer in [{low}, 10000000] with method={self.method}, "
                f"got {self.timesteps!r}"
            )
        lr = self.learning_rate
        if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr <= 1e-2:
            raise ValueError(f"finetuning.learning_rate must lie in (0, 0.01], got {lr!r}")
        for name, low, high in (("episodes", 1, 10_000), ("dagger_rounds", 0, 20),
                                ("dagger_episodes", 1, 10_000), ("epochs", 1, 1000)):  # fmt: skip
            if not _whole(getattr(self, name), low, high):
                raise ValueError(
                    f"finetuning.{name} must be an integer in [{low}, {high}], got {getattr(self, name)!r}"
                )
        if not isinstance(self.domain, dict):
            raise ValueError(
                f"finetuning.domain must be a mapping of DomainRandomization fields, got {self.domain!r}"
            )
        for name in ("seeds", "opening_seeds"):
            seeds = getattr(self, name)
            if not 1 <= len(set(seeds)) <= 100 or any(
                isinstance(s, bool) or not isinstance(s, int) for s in seeds
            ):
                raise ValueError(
                    f"finetuning.{name} must list 1-100 distinct integer seeds, got {list(seeds)}"
                )
        if set(self.seeds) & set(self.opening_seeds):
            raise ValueError(
                f"finetuning.opening_seeds must differ from finetuning.seeds (held out for the verdict): "
                f"both hold {sorted(set(self.seeds) & set(self.opening_seeds))}"
            )
        if self.opening not in OPENINGS:
            raise ValueError(f"finetuning.opening must be one of {list(OPENINGS)}, got {self.opening!r}")
        if not isinstance(self.progress, bool):
            raise ValueError(f"finetuning.progress must be true or false, got {self.progress!r}")

    @classmethod
    def from_config(cls, node: Any) -> Finetuning:
        return settings(cls, node, "finetuning", sequences=("seeds", "opening_seeds"))


def check_finetune(controller: Any, calibrating: bool) -> PPOController:
    """The PPO bundle to fine-tune; an error naming what to set when there is none to refit on."""
    if not calibrating:
        raise ValueError(
            "finetune=true fine-tunes in the simulator refitted by the quick calibration: set calibrate.quick=true"
        )
    if not isinstance(controller, PPOController):
        raise ValueError(
            f"finetune=true fine-tunes a PPO bundle (policy=<bundle dir>); the controller here is "
            f"{getattr(controller, 'name', type(controller).__name__)!r}"
        )
    return controller


def finetune_domain(refit_dir: Path, scale_s: float, settings: Finetuning) -> dict[str, Any]:
    """The fine-tuning worlds: the refit's cluster and job, its workers' static speeds ~ exp(N(0, 0.5))
    apart, one throttling window (to 0.3-0.8x) starting within the first ``scale_s`` seconds and
    lasting 10-50 % of them (the shape of ``experiment=train_profile``'s domain, scaled to this
    job's episode), then ``finetuning.domain`` over it."""
    s = float(scale_s)
    return {
        "profile": str(refit_dir),
        "scenarios": ["static_hetero"],  # fault rates are per hour: nothing else happens in an episode
        "speed_sd": 0.5,
        "throttle_windows": 1,
        "window_start_s": [0.0, s],
        "window_duration_s": [0.1 * s, 0.5 * s],
        "window_factor": [0.3, 0.8],
        **settings.domain,
    }


def expert_of(bundle: Any) -> dict[str, Any]:
    """The expert ``bundle`` was distilled from (its config's ``expert_pretrain``), else the
    time-to-target oracle."""
    pre = (bundle.meta.config or {}).get("expert_pretrain") or {}
    if pre.get("expert"):
        return {"expert": str(pre["expert"]), "expert_kwargs": dict(pre.get("expert_kwargs") or {})}
    return {"expert": "oracle", "expert_kwargs": {"objective": "time_to_target", "batch_penalty": 0.0}}


def train_config(
    bundle: Any,
    refit_dir: Path,
    settings: Finetuning,
    run_dir: Path,
    seed: int,
    interval: int,
    scale_s: float,
    opening: int | None = None,
) -> TrainConfig:
    """The bundle's own training config (its policy, PPO and reward settings), in the refit's worlds
    (:func:`finetune_domain`) at the deploy's ``interval``, each starting at local batch ``opening``
    (None: the refit's initial batch), fine-tuning from it as ``settings.method`` says, bounded by
    ``settings.max_s`` (no checkpoints to resume; validated on one seed of those worlds at the start
    and the end)."""
    cfg = dict(bundle.meta.config or {})
    names = {f.name for f in fields(TrainConfig)}
    kwargs = {k: v for k, v in cfg.items() if k in names}
    held_out = set(settings.seeds) & ({int(s) for s in kwargs.get("eval_seeds", ())} | {int(seed)})
    if held_out:
        raise ValueError(
            f"finetuning.seeds {sorted(held_out)} are the bundle's validation seeds or the fine-tune's "
            "seed: held-out seeds must differ"
        )
    ppo = {k: v for k, v in (kwargs.get("ppo") or {}).items() if k in FINETUNE_PPO_KEYS}
    workers = load_profile(refit_dir).cluster.num_workers
    imitate = settings.method == "imitate"
    env = {k: v for k, v in (kwargs.get("env") or {}).items() if k not in ("split", "split_tolerance")}
    kwargs.update(
        run_dir=str(run_dir),
        seed=int(seed),
        finetune_from=str(bundle.path),
        # as many envs as the bundle trained with, each of the refit's one cluster size (a universal
        # bundle was trained over several sizes; a profile measured one)
        cluster_sizes=[workers] * len(kwargs.get("cluster_sizes") or [1]),
        domain=finetune_domain(refit_dir, scale_s, settings),
        # the split the bundle is deployed under (its meta, set by finetune_from), not the one its
        # weights were trained under (bundle.json's config; they differ for a re-deployed bundle)
        env={
            **env,
            **({"reward": cfg["reward"]} if "reward" in cfg else {}),
            "interval": int(interval),
            **(
                {}
                if opening is None
                else {"sim_kwargs": {**(env.get("sim_kwargs") or {}), "initial_batch": int(opening)}}
            ),
        },
        ppo={**ppo, "learning_rate": float(settings.learning_rate)},
        total_timesteps=int(settings.timesteps),
        max_train_s=float(settings.max_s),
        # its weights read inputs normalised by its statistics: PPO must not move them under it
        freeze_obs_norm=bool(kwargs.get("normalize_obs", True)),
        # the critic meets the refit's returns first (after an imitation too): actor frozen meanwhile
        critic_warmup_steps=int(settings.timesteps) // 4,
        eval_every=10 * max(int(settings.timesteps), 1),  # validated at the start and the end only
        eval_scenarios=["domain"],
        eval_workers=workers,
        eval_seeds=list(kwargs.get("eval_seeds") or [1000])[:1],
        eval_tasks=(),
        checkpoint_every=10 * max(int(settings.timesteps), 1),
        resume=False,
        subprocess=False,
        expert_pretrain={
            **expert_of(bundle),
            "episodes": settings.episodes,
            "epochs": settings.epochs,
            "dagger_rounds": settings.dagger_rounds,
            "dagger_episodes": settings.dagger_episodes,
        }
        if imitate
        else None,
        progress_bar=bool(settings.progress),
    )
    return TrainConfig(**kwargs)


def held_out_tta(
    controller: Any,
    refit_dir: Path,
    scenario: Any,
    interval: int,
    seeds: tuple[int, ...],
    initial_batch: int | None = None,
) -> list[float]:
    """Per seed: the score of ``controller`` in the refitted simulator under ``scenario``, its
    first interval at local batch ``initial_batch`` (None: the refit's; a controller's own opening
    wins): its time to accuracy, or the time budget when it misses the target (the benchmark's one
    score, :func:`dynamix_gym.benchmark.scoring.run_score_s`)."""
    profile = load_profile(refit_dir)
    out = []
    for seed in seeds:
        env = HeteroClusterEnv(
            profile=profile,
            scenario=scenario,
            interval=interval,
            action_mode=controller.action_mode,
            initial_batch=initial_batch,
            **env_options(controller),
        )
        try:
            s = run_episode(env, controller, int(seed)).summary
            out.append(
                run_score_s(s["reached_target"], s["time_to_accuracy_s"], env.backend.spec.time_budget_s)
            )
        finally:
            env.close()
    return out


def opening_candidates(refit_dir: Path, job_batch: int, ladder: tuple[int, ...]) -> list[int]:
    """The local batches an opening may take: the job's first, then the ladder's that every worker
    of the refit may run (sorted)."""
    env = HeteroClusterEnv(profile=load_profile(refit_dir))
    spec = env.backend.spec
    env.close()
    lo, hi = int(np.max(spec.min_batch)), int(np.min(spec.max_batch))
    if not lo <= int(job_batch) <= hi:
        raise ValueError(f"the job's local batch {job_batch} lies outside the refit's range [{lo}, {hi}]")
    return [int(job_batch), *sorted({int(b) for b in ladder if lo <= int(b) <= hi} - {int(job_batch)})]


def choose_opening(
    expert: Any,
    refit_dir: Path,
    scenario: Any,
    interval: int,
    seeds: tuple[int, ...],
    candidates: list[int],
) -> dict[str, Any]:
    """The expert's mean score in the refit from each candidate opening (``candidates[0]``, the
    job's batch, first) on ``seeds``; the chosen one is the job's unless another is strictly faster."""
    scores = {
        b: float(np.mean(held_out_tta(expert, refit_dir, scenario, interval, seeds, b))) for b in candidates
    }
    job = candidates[0]
    best = min(candidates, key=lambda b: (scores[b], b != job))
    return {
        "job": job,
        "chosen": best,
        "expert_mean_tta_s": {str(b): scores[b] for b in candidates},
        "seeds": list(seeds),
    }


def _expert_controller(bundle: Any) -> Any:
    from dynamix_gym.controllers.registry import make_controller

    ex = expert_of(bundle)
    return make_controller(ex["expert"], **ex["expert_kwargs"])


def finetune_in_refit(
    controller: PPOController,
    refit_dir: Path,
    scenario: Any,
    interval: int,
    settings: Finetuning,
    out: Path,
    seed: int,
    job_batch: int | None = None,
    ladder: tuple[int, ...] = (),
) -> tuple[PPOController, dict[str, Any]]:
    """Fine-tune, score both bundles on the held-out seeds, and return the controller to deploy
    (the fine-tuned one only if it is faster there, with its opening) with the record written to
    ``out/finetune.json``. ``job_batch``: the job's own first-interval local batch (None: the
    refit's, and no opening is chosen); ``ladder``: the quick calibration's batches, the openings
    ``finetuning.opening=refit`` considers besides the job's."""
    bundle = controller.bundle
    if int(seed) in set(settings.seeds) | set(settings.opening_seeds):
        raise ValueError(
            f"seed {seed} is one of finetuning.seeds or finetuning.opening_seeds (held out): the "
            "fine-tune's seed must differ"
        )
    opening = None
    if settings.opening == "refit" and job_batch is not None:
        candidates = opening_candidates(refit_dir, int(job_batch), tuple(ladder))
        opening = choose_opening(
            _expert_controller(bundle), refit_dir, scenario, interval, settings.opening_seeds, candidates
        )
        log.info(
            "opening: the expert's mean time to accuracy in the refit from local batch %s: %s; the fine-tune starts at %d",
            ", ".join(opening["expert_mean_tta_s"]),
            ", ".join(f"{v:.2f} s" for v in opening["expert_mean_tta_s"].values()),
            opening["chosen"],
        )
    start = None if opening is None else int(opening["chosen"])
    # the time scale of the job's episode: the bundle's own run of the deploy's scenario at the
    # fine-tune's seed (not a held-out one)
    scale_s = held_out_tta(controller, refit_dir, scenario, interval, (int(seed),), job_batch)[0]
    cfg = train_config(bundle, refit_dir, settings, out / RUN_DIR, seed, interval, scale_s, start)
    log.info(
        "fine-tuning %s in the refitted simulator (%s) for at most %.0f s",
        shown(bundle.path),
        settings.method,
        settings.max_s,
    )
    # the fine-tuned bundle records the run that made it (its domain's profile: the refitted one)
    made = {f.name: getattr(cfg, f.name) for f in fields(TrainConfig)}
    result = train(
        cfg,
        config_dict={
            **(bundle.meta.config or {}),
            **made,
            "reward": (bundle.meta.config or {}).get("reward"),
        },
    )
    tuned = PPOController(
        bundle=load_bundle(result["final_bundle"]),
        opening=None if start is None or start == job_batch else start,
    )
    before = held_out_tta(controller, refit_dir, scenario, interval, settings.seeds, job_batch)
    after = held_out_tta(tuned, refit_dir, scenario, interval, settings.seeds, job_batch)
    kept = float(np.mean(after)) < float(np.mean(before))
    if opening is not None:
        opening["applied"] = bool(kept and tuned.opening is not None)
    record = {
        "bundle": shown(bundle.path),
        "finetuned": shown(result["final_bundle"]),
        "profile": shown(refit_dir),
        "scenario": getattr(scenario, "name", str(scenario)),
        "seeds": list(settings.seeds),
        "tta_s": {"bundle": before, "finetuned": after},
        "mean_tta_s": {"bundle": float(np.mean(before)), "finetuned": float(np.mean(after))},
        "method": settings.method,
        "episode_scale_s": scale_s,
        "train": {
            **{k: result[k] for k in ("timesteps", "train_seconds", "stopped_by_wall_clock")},
            "seconds": result.get("seconds"),
            "imitation": result.get("warm_start"),
        },
        "max_s": settings.max_s,
        "kept": kept,
        "opening": opening,
    }
    atomic_write_text(out / RECORD_FILE, dump_json(record))
    log.info(
        "fine-tuned bundle %s: mean time to accuracy on %d held-out simulated seeds %.1f s vs the bundle's %.1f s "
        "(%d timesteps in %.0f s)",
        "KEPT" if kept else "not kept",
        len(settings.seeds),
        record["mean_tta_s"]["finetuned"],
        record["mean_tta_s"]["bundle"],
        result["timesteps"],
        result["train_seconds"],
    )
    return (tuned if kept else controller), record
