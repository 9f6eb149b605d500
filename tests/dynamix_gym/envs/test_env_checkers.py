"""Every documented combination of the cluster envs through Gymnasium's and SB3's checkers: each
observation schema x action mode x split, centralised and per worker, and the training worlds of
the shipped bundle (schema 3, scale steps, balanced_cost), not only the registered defaults."""

from __future__ import annotations

import itertools
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import dynamix_gym  # noqa: F401  (registers the ids)
from dynamix_gym.actions import ACTION_MODES, DISCRETE_ACTION_MODES, SPLIT_MODES
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.per_worker import PerWorkerEnv
from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv
from dynamix_gym.obs import get_schema

SCHEMAS = (1, 2, 3)
#: The checkers' advice for an unnormalised Box: the absolute mode's action is local batches in samples,
#: the baselines' form (a learner drives the delta, scale or continuous mode).
UNNORMALISED_BOX = "symmetric and normalized"


def _check(make, expected_warning: str | None = None) -> None:
    """Both checkers pass; the only warning allowed is ``expected_warning`` (and then it must come)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(make(), skip_render_check=True)
        sb3_check_env(make(), warn=True)
    messages = [str(w.message) for w in caught]
    unexpected = [m for m in messages if expected_warning is None or expected_warning not in m]
    assert not unexpected, unexpected
    if expected_warning is not None:
        assert messages, f"expected the checkers to warn: {expected_warning}"


@pytest.mark.parametrize(
    ("schema", "mode", "split"), list(itertools.product(SCHEMAS, ACTION_MODES, SPLIT_MODES))
)
def test_the_centralised_env_passes_the_checkers_in_every_combination(schema, mode, split):
    kw = dict(workers=3, scenario="mixed", obs_schema=schema, action_mode=mode, split=split)
    _check(lambda: HeteroClusterEnv(**kw), UNNORMALISED_BOX if mode == "absolute" else None)
    assert get_schema(schema).version == HeteroClusterEnv(**kw).obs_schema.version


@pytest.mark.parametrize(
    ("schema", "mode", "split"), list(itertools.product(SCHEMAS, DISCRETE_ACTION_MODES, SPLIT_MODES))
)
def test_the_per_worker_env_passes_the_checkers_in_every_combination(schema, mode, split):
    _check(
        lambda: PerWorkerEnv(workers=3, scenario="mixed", obs_schema=schema, action_mode=mode, split=split)
    )


@pytest.mark.parametrize("mode", sorted(set(ACTION_MODES) - set(DISCRETE_ACTION_MODES)))
def test_the_per_worker_env_refuses_the_other_modes_by_name(mode):
    with pytest.raises(ValueError, match="action_mode"):
        PerWorkerEnv(workers=3, action_mode=mode)


def test_the_shipped_bundles_setup_through_gym_make_passes_the_checkers():
    """The universal bundle's setup (schema 3, multiplicative steps, the cost-aware split) as a user
    makes it, and the generated training worlds it was trained in."""
    kw = dict(workers=4, obs_schema=3, action_mode="scale", split="balanced_cost")
    _check(lambda: gym.make("dynamix/HeteroCluster-v0", **kw).unwrapped)
    _check(lambda: gym.make("dynamix/HeteroClusterPerWorker-v0", **kw).unwrapped)
    domain = DomainRandomization(workers=4, gpu_types=("T4", "V100", "A100"), workloads=("cifar10", "ncf"))
    _check(
        lambda: RandomizedClusterEnv(domain=domain, obs_schema=3, action_mode="scale", split="balanced_cost")
    )
