"""The pipeline policy's warm start: the truth-reading teacher's data, cloning, DAgger labels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import GreedyGainController
from dynamix_gym.pipeline.imitation import TruthTeacher, collect_teacher_data, make_teacher
from sim.cluster import homogeneous_cluster
from sim.faults import FaultWindow, Scenario
from sim.pipeline.model import ModelShape, generate_model

QUIET = Scenario("quiet", compute_noise_cv=0.0, measurement_noise_cv=0.0)


def throttled_env(max_decisions: int = 30) -> PipelineClusterEnv:
    """4 V100 stages of 4 even blocks; worker 1 throttled to 0.4x from 100 s on."""
    model = generate_model(np.random.default_rng(3), ModelShape(num_blocks=(16, 16), unevenness=(0.0, 0.0)))
    window = FaultWindow("throttle", start_s=100.0, duration_s=1e6, worker=1, factor=0.4)
    return PipelineClusterEnv(homogeneous_cluster("V100", 4), model, dataclasses.replace(QUIET, windows=(window,)),
                              stages=4, interval=5000, interval_s=20.0, target_quality=0.99,
                              max_decisions=max_decisions)  # fmt: skip


class _Hold:
    """A stand-in student that never moves a boundary (DAgger: it acts, the teacher labels)."""

    def __init__(self, env):
        self.env = env

    def predict(self, obs, deterministic=True, action_masks=None):
        assert action_masks is not None  # the student is always given the env's masks
        return self.env.action_for(self.env.sizes), None


def test_teacher_moves_blocks_off_a_throttled_stage_and_its_data_is_consistent():
    env = throttled_env()
    data = collect_teacher_data(env, [0], gamma=0.99, teacher=TruthTeacher(0.1))
    n = len(data.actions)
    assert data.obs.shape == (n, env.observation_space.shape[0])
    assert data.actions.shape == (n, len(env.action_space.nvec))
    assert data.returns.shape == (n,) and np.all(np.isfinite(data.returns))
    assert np.all(data.episode_decisions == n) and data.episodes == 1
    assert np.all(data.actions < env.action_space.nvec)  # every label is a legal index
    assert env.sizes[1] < 4  # the teacher acted: blocks moved off the throttled stage
    assert np.any(data.actions[:, :3] != 1)  # and its labels say so


def test_dagger_labels_are_the_teachers_while_the_student_acts():
    env = throttled_env()
    data = collect_teacher_data(env, [0], gamma=0.99, teacher=TruthTeacher(0.1), policy=_Hold(env))
    assert env.sizes == (4, 4, 4, 4)  # the student held: nothing moved
    assert np.any(data.actions[:, :3] != 1)  # the teacher, labelling, would have moved


def test_bad_arguments_are_refused():
    env = throttled_env()
    with pytest.raises(ValueError, match="at least one seed"):
        collect_teacher_data(env, [], gamma=0.99)
    with pytest.raises(ValueError, match="gamma"):
        collect_teacher_data(env, [0], gamma=1.5)
    with pytest.raises(ValueError, match=r"imitation\.teacher"):
        make_teacher("oracle")
    with pytest.raises(ValueError, match="threshold"):
        GreedyGainController(threshold=-0.1)


def test_sample_weights_are_checked():
    from dynamix_gym.learning.imitation import pretrain

    data = collect_teacher_data(throttled_env(max_decisions=3), [0], gamma=0.99)
    with pytest.raises(ValueError, match="sample_weights"):
        pretrain(None, data, lambda x: x, 1.0, sample_weights=np.ones(len(data.actions) + 1))


def test_greedy_teacher_reads_only_the_observed_move_gains():
    """The greedy teacher's action is a function of the v1 observation: it moves exactly when the
    largest observed move gain (the features, mapped back) exceeds its threshold."""
    env = throttled_env()
    teacher = GreedyGainController(0.1)
    obs, info = env.reset(seed=0, options=teacher.start_options(env, 0))
    teacher.reset(env)
    moved = 0
    for _ in range(20):
        action, _ = teacher.predict(obs, info)
        gains = (obs[-2 * (env.max_stages - 1) :] + 1.0) / 2.0 - 0.5  # _lin(-0.5, 0.5) inverted
        expect_move = gains.max() > 0.1 + 1e-6
        assert bool(np.any(action[:-1] != 1)) == expect_move
        moved += expect_move
        obs, _, _, _, info = env.step(action)
    assert moved >= 1


def test_a_cloned_student_moves_blocks_off_the_throttled_stage():
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO

    from dynamix_gym.learning.imitation import pretrain

    env = throttled_env()
    data = collect_teacher_data(env, [0, 1], gamma=0.99)
    model = MaskablePPO("MlpPolicy", env, seed=0, device="cpu", n_steps=64, batch_size=32)
    moves = np.any(data.actions[:, :-1] != 1, axis=1)
    assert 0 < moves.sum() < len(moves) / 4  # moves are rare: they are weighed up
    stats = pretrain(model, data, lambda x: x, float(np.std(data.returns)) + 1e-8, epochs=200,
                     batch_size=64, seed=0, sample_weights=np.where(moves, 10.0, 1.0))  # fmt: skip
    assert stats["action_agreement"] > 0.95
    obs, _ = env.reset(seed=2, options=TruthTeacher().start_options(env, 2))
    assert env.sizes == (4, 4, 4, 4)
    done = False
    while not done:  # the student alone: observations and masks, never the report's truth
        action, _ = model.predict(obs, deterministic=True, action_masks=env.action_masks())
        obs, _, term, trunc, _ = env.step(action)
        done = term or trunc
    assert env.sizes[1] < 4
