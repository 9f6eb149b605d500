"""Train the pipeline policy: MaskablePPO on generated pipelines (the pipeline split's train worlds).

    python -m experiments.pipeline_train                   # conf/pipeline_train.yaml

Every episode draws a world of the train split (8-64 uneven blocks, 2-8 stages, 1-3 GPU types, the
fault families) from its seed and starts from DynPipe's plan (the warm start); rewards are the
``time`` reward, normalised by a running estimate of their scale (VecNormalize). Writes the model
zip to ``out``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import dynpipe_start
from dynamix_gym.pipeline.worlds import world_fn
from experiments.common import REPO_ROOT

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
    model.learn(total_timesteps=int(cfg.timesteps))
    out = Path(cfg.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(out)
    log.info("trained %d steps in %.0f s -> %s", int(cfg.timesteps), time.perf_counter() - t0, out)
    return out


@hydra.main(version_base=None, config_path="../conf", config_name="pipeline_train")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
