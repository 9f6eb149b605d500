"""The time-to-target oracle: it sees the no-scaling regime's accuracy trade-off."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamix_gym.controllers.oracle import OracleController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from sim.cluster import mixed_cluster


def global_batches(objective: str, steps: int = 40) -> tuple[list[int], HeteroClusterEnv]:
    env = HeteroClusterEnv(
        workers=8, workload="cifar100_resnet34", scenario="static_hetero", action_mode="absolute", interval=50
    )
    kw = {"objective": objective, "batch_penalty": 0.0} if objective == "time_to_target" else {}
    oracle = OracleController(**kw)
    obs, info = env.reset(seed=3)
    oracle.reset(env.backend.spec, np.random.default_rng(3))
    out = []
    for _ in range(steps):
        action, _ = oracle.predict(obs, info)
        obs, _, terminated, truncated, info = env.step(action)
        out.append(int(info["report"].global_batch))
        if terminated or truncated:
            break
    return out, env


def test_time_to_target_oracle_keeps_the_plateau_above_the_target():
    goodput, _ = global_batches("goodput")
    tta, env = global_batches("time_to_target")
    # CIFAR-100 without learning-rate scaling: 0.82 at a global batch of 256, 3 points lower per
    # doubling, target 0.76. The goodput oracle grows past 1024, where the plateau meets the target.
    assert max(goodput[5:]) > 1024
    assert max(tta[5:]) < 1024
    # ... and every batch it holds can still reach the target, by the simulator's own model.
    need = env.backend.ground_truth.progress_to_target(np.array(tta[-1:], dtype=float))
    assert math.isfinite(need[0])


def test_time_to_target_oracle_arguments_are_checked():
    with pytest.raises(ValueError, match=r"objective must be one of \('goodput', 'time_to_target'\)"):
        OracleController(objective="fastest")
    with pytest.raises(ValueError, match=r"batch_penalty must be 0 with objective='time_to_target'"):
        OracleController(objective="time_to_target")


def run_oracle(oracle: OracleController, workload: str, seed: int, **env_kw) -> tuple[list, HeteroClusterEnv]:
    """Every interval's report of one episode driven by ``oracle``."""
    env_kw.setdefault("workers", None if "cluster" in env_kw else 8)
    env = HeteroClusterEnv(workload=workload, action_mode="absolute", interval=50, **env_kw)
    obs, info = env.reset(seed=seed)
    oracle.reset(env.backend.spec, np.random.default_rng(seed))
    reports = [info["report"]]
    for _ in range(2000):
        action, _ = oracle.predict(obs, info)
        obs, _, terminated, truncated, info = env.step(action)
        reports.append(info["report"])
        if terminated or truncated:
            break
    return reports, env


TTA = {"objective": "time_to_target", "batch_penalty": 0.0}


@pytest.mark.parametrize(("scenario", "seed"), [("jitter", 0), ("jitter", 1), ("static_hetero", 1)])
def test_the_end_game_pays_no_pause_for_a_batch_that_finishes_in_the_same_interval(scenario, seed):
    # NCF on 4 A100s beside 4 T4s reaches its target within four 50-iteration intervals: the plain
    # time-to-target oracle moves to a larger global batch for the last one (a 1 s pause for a
    # target it reaches in that interval either way); the end game holds and finishes sooner.
    cluster = mixed_cluster({"A100": 4, "T4": 4})
    plain, _ = run_oracle(OracleController(**TTA), "ncf", seed, cluster=cluster, scenario=scenario)
    end, env = run_oracle(
        OracleController(**TTA, endgame_intervals=10), "ncf", seed, cluster=cluster, scenario=scenario
    )
    target = env.backend.spec.target_accuracy
    assert plain[-1].val_accuracy >= target and end[-1].val_accuracy >= target
    assert plain[-1].reconfig_time_s == 1.0  # the simulator's default pause, paid in the last interval
    assert end[-1].reconfig_time_s == 0.0
    assert end[-1].wall_time_s < plain[-1].wall_time_s - 1.0


def test_the_ground_truth_tells_the_pause_overhead_and_measurement_noise():
    env = HeteroClusterEnv(
        workers=4, workload="ncf", sim_kwargs={"reconfig_delay_s": 0.5, "interval_overhead_s": 0.2}
    )
    env.reset(seed=0)
    truth = env.backend.ground_truth
    assert (truth.reconfig_delay_s, truth.interval_overhead_s) == (0.5, 0.2)
    # NCF's 6,040 held-out users: a binomial standard deviation at a true quality of 0.68
    assert truth.validation_sd(0.68) == pytest.approx(math.sqrt(0.68 * 0.32 / 6040))
    # a lower quality is reached no later than the target, on the same held batch
    batches = np.array([2048.0, 65536.0])
    assert np.all(truth.progress_to_target(batches, 0.5) <= truth.progress_to_target(batches))


def test_the_end_game_leaves_the_decisions_far_from_the_target_alone():
    plain, _ = run_oracle(OracleController(**TTA), "cifar10", 1, scenario="throttle")
    end, _ = run_oracle(OracleController(**TTA, endgame_intervals=3), "cifar10", 1, scenario="throttle")
    assert len(plain) > 40  # a long run: the end game covers its last few intervals at most
    same = [np.array_equal(a.local_batch, b.local_batch) for a, b in zip(plain, end, strict=False)]
    assert all(same[: len(plain) - 10])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"objective": "time_to_target", "batch_penalty": 0.0, "endgame_intervals": 0},
            "endgame_intervals must be an integer >= 1",
        ),
        (
            {"objective": "time_to_target", "batch_penalty": 0.0, "endgame_intervals": True},
            "endgame_intervals must be an integer >= 1",
        ),
        (
            {"objective": "time_to_target", "batch_penalty": 0.0, "endgame_intervals": 2.5},
            "endgame_intervals must be an integer >= 1",
        ),
        ({"endgame_intervals": 3}, "endgame_intervals needs objective='time_to_target'"),
    ],
)
def test_end_game_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OracleController(**kwargs)


def _oracle_run(instability, guards=None):
    """The time-to-target oracle on a linear-rule CIFAR-10 run, with ``instability`` modelled."""
    from dynamix_gym.backends.sim_backend import SimBackend
    from dynamix_gym.evaluation import run_episode

    backend = SimBackend(
        "t4v100_4", "cifar10", "static_hetero", lr_rule="linear", instability=instability, guards=guards
    )
    env = HeteroClusterEnv(backend=backend, interval=50, action_mode="absolute", max_decisions=250)
    oracle = OracleController(objective="time_to_target", batch_penalty=0.0)
    result = run_episode(env, oracle, seed=1)
    return result, backend


def test_where_a_rise_of_the_rate_can_collapse_the_oracle_counts_its_expected_cost():
    from sim.instability import InstabilityParams

    # half the rises to x2 the base rate collapse, a rise to x4 almost always; a collapse loses it all
    severe = InstabilityParams("severe", intercept=-4.0, slope=4.0, ramp_effect=0.0, depth=1.0)
    free, _ = _oracle_run(None)
    careful, backend = _oracle_run(severe, guards="off")
    grow = max(r["global_batch"] for r in free.timeline)
    held = max(r["global_batch"] for r in careful.timeline)
    assert grow > 256  # without instability the linear rule's large batches are free
    assert held < grow and backend.sim.instability.collapses <= 1  # it does not gamble on them
    assert careful.summary["reached_target"]
    # the ground truth's risk: none before the first interval or without a model, the fit's chance after
    truth = backend.ground_truth
    chance, depth, stuck = truth.collapse_risk(np.array([1.0, 1e6]))
    assert depth == 1.0 and chance[0] == 0.0 and chance[1] == pytest.approx(1.0)
    assert stuck.tolist() == [False, False] or backend.sim.instability.stuck
    _, plain = _oracle_run(None)
    chance, depth, stuck = plain.ground_truth.collapse_risk(np.array([1e6]))
    assert chance.tolist() == [0.0] and depth == 0.0 and stuck.tolist() == [False]
