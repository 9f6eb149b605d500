"""Train the pipeline policy: MaskablePPO on generated pipelines (the pipeline split's train worlds).

    python -m experiments.pipeline_train                   # conf/pipeline_train.yaml

Every episode draws a world of the train split (8-64 uneven blocks, 2-8 stages, 1-3 GPU types, the
fault families) from its seed and starts from DynPipe's plan; rewards are the ``time`` reward,
normalised by a running estimate of their scale (VecNormalize). With ``imitation.episodes`` > 0 the
policy is first cloned from a teacher (:mod:`dynamix_gym.pipeline.imitation`: ``greedy_gain`` or
``truth``; behaviour cloning, then ``imitation.dagger_rounds`` of DAgger) on train-split seeds from
``imitation.seed_offset``, and PPO (``timesteps``, 0 for none) fine-tunes it. Writes the model zip
to ``out`` and what the warm start measured beside it (``<out>.json``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import dynpipe_start
from dynamix_gym.pipeline.worlds import world_fn
from experiments.common import REPO_ROOT, atomic_write_text

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> Path:
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)

    def make():
        return PipelineClusterEnv(world=world_fn("train"), schedule=cfg.schedule, interval=int(cfg.interval),
                                  interval_s=cfg.interval_s, start_planner=dynpipe_start)  # fmt: skip

    venv = VecNormalize(
        make_vec_env(make, n_envs=int(cfg.n_envs), seed=int(cfg.seed)), norm_obs=False, norm_reward=True
    )
    model = MaskablePPO("MlpPolicy", venv, seed=int(cfg.seed), device="cpu", verbose=0,
                        **OmegaConf.to_container(cfg.ppo))  # fmt: skip
    t0 = time.perf_counter()
    stats: dict = {}
    if int(cfg.imitation.episodes) > 0:
        stats["warm_start"] = warm_start(cfg, model, venv, make)
    if int(cfg.timesteps) > 0:
        model.learn(total_timesteps=int(cfg.timesteps))
    stats.update(timesteps=int(cfg.timesteps), seconds=time.perf_counter() - t0)
    out = Path(cfg.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(out)
    atomic_write_text(out.with_suffix(".json"), json.dumps({"config": OmegaConf.to_container(cfg), **stats},
                                                           indent=1) + "\n")  # fmt: skip
    log.info("trained (%d PPO steps) in %.0f s -> %s", int(cfg.timesteps), stats["seconds"], out)
    return out


def warm_start(cfg: DictConfig, model, venv, make) -> dict:
    """Behaviour cloning from the teacher (``imitation.teacher``), then DAgger rounds (the student acts, the
    teacher labels, the policy refit on everything gathered); the reward scale of VecNormalize set
    from the teacher's returns so the value head's targets are what PPO will see."""
    import numpy as np

    from dynamix_gym.learning.imitation import pretrain
    from dynamix_gym.pipeline.imitation import collect_teacher_data, make_teacher

    opts = cfg.imitation
    move_weight = float(opts.move_weight)
    if not move_weight > 0:
        raise ValueError(f"imitation.move_weight must be > 0, got {move_weight}")
    gamma = float(cfg.ppo.gamma)
    env = make()
    first = int(opts.seed_offset)
    seeds = list(range(first, first + int(opts.episodes)))
    t0 = time.perf_counter()
    teacher = make_teacher(str(opts.teacher), float(opts.threshold), float(opts.min_gain))
    data = collect_teacher_data(env, seeds, gamma, teacher)
    log.info("teacher: %d episodes, %d decisions, mean TTA %.0f s (%.0f s)", data.episodes,
             len(data.actions), data.mean_tta_s, time.perf_counter() - t0)  # fmt: skip
    venv.ret_rms.var = np.asarray(float(np.var(data.returns)))
    venv.ret_rms.count = float(len(data.returns))
    scale = float(np.sqrt(venv.ret_rms.var + venv.epsilon))
    ident = lambda x: x  # noqa: E731  (observations are not normalised: norm_obs=False)
    epochs, lr = int(opts.epochs), float(opts.learning_rate)

    def moves(d):  # the decisions where the teacher moves a boundary (entry 1: hold)
        return np.any(d.actions[:, :-1] != 1, axis=1)

    def weights(d):  # a move weighs move_weight
        return np.where(moves(d), move_weight, 1.0)

    stats = pretrain(model, data, ident, scale, epochs=epochs, learning_rate=lr, seed=int(cfg.seed),
                     sample_weights=weights(data))  # fmt: skip
    out = {"teacher_episodes": data.episodes, "teacher_mean_tta_s": data.mean_tta_s, "cloning": stats,
           "teacher_move_share": float(np.mean(moves(data))), "dagger": []}  # fmt: skip
    for k in range(int(opts.dagger_rounds)):
        first = seeds[-1] + 1
        seeds = list(range(first, first + int(opts.episodes_per_dagger_round)))
        new = collect_teacher_data(env, seeds, gamma, teacher, policy=model)
        data = data + new
        stats = pretrain(model, data, ident, scale, epochs=max(epochs // 2, 1), learning_rate=lr / 2,
                         seed=int(cfg.seed) + k + 1, sample_weights=weights(data))  # fmt: skip
        out["dagger"].append({"student_mean_tta_s": new.mean_tta_s, "episodes": new.episodes, **stats})
        log.info("DAgger round %d: student mean TTA %.0f s; %s", k + 1, new.mean_tta_s, stats)
    env.close()
    out.update(samples=len(data.actions), seconds=time.perf_counter() - t0)
    return out


@hydra.main(version_base=None, config_path="../conf", config_name="pipeline_train")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
