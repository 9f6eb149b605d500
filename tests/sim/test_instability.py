"""Divergence in the simulator (sim.instability) and the guards modelled there (SimBackend(guards=))."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynamix_gym.backends.sim_backend import SimBackend
from dynamix_gym.controllers.reckless import RecklessController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from sim.engine import Simulator
from sim.instability import InstabilityParams, load_instability

ALWAYS = InstabilityParams("always", intercept=50.0, slope=0.0, ramp_effect=0.0, depth=1.0)
NEVER = InstabilityParams("never", intercept=-500.0, slope=0.0, ramp_effect=0.0, depth=0.5)


def _run(sim: Simulator, plan: list[int], k: int = 20) -> list:
    sim.reset(seed=3)
    return [sim.run_interval(np.full(sim.num_workers, b), k) for b in plan]


def test_a_model_that_never_fires_changes_no_draw_of_the_run():
    plain = _run(Simulator("t4v100_4", "cifar10", "mixed", lr_rule="linear"), [64, 64, 256, 256])
    never = _run(
        Simulator("t4v100_4", "cifar10", "mixed", lr_rule="linear", instability=NEVER), [64, 64, 256, 256]
    )
    assert [r.val_accuracy for r in plain] == [r.val_accuracy for r in never]
    assert [r.wall_time_s for r in plain] == [r.wall_time_s for r in never]


def test_a_rise_of_the_rate_collapses_progress_which_stays_stuck_until_the_rate_falls():
    sim = Simulator("t4v100_4", "cifar10", "static_hetero", lr_rule="linear", instability=ALWAYS)
    sim.reset(seed=0)
    for _ in range(30):
        sim.run_interval(np.full(4, 64), 50)
    before = sim.progress
    assert before > 0
    sim.run_interval(np.full(4, 256), 50)  # x4 the batch, x4 the rate: collapses at once
    assert sim.progress == 0.0 and sim.instability.collapses == 1
    sim.run_interval(np.full(4, 256), 50)
    assert sim.progress == 0.0  # stuck at the rate that collapsed it
    sim.run_interval(np.full(4, 64), 50)  # a lower rate: training moves again
    assert sim.progress > 0.0 and sim.instability.collapses == 1
    steady = Simulator("t4v100_4", "cifar10", "static_hetero", lr_rule="none", instability=ALWAYS)
    steady.reset(seed=0)
    steady.run_interval(np.full(4, 64), 50)
    steady.run_interval(np.full(4, 256), 50)  # no rise of the rate under `none`
    assert steady.instability.collapses == 0


def test_the_chance_rises_with_the_rate_and_falls_with_a_ramp():
    p = InstabilityParams("fit", intercept=-4.0, slope=2.0, ramp_effect=-1.5, depth=0.8)
    assert p.chance(1.0, False) < p.chance(4.0, False) < p.chance(16.0, False)
    assert p.chance(4.0, True) < p.chance(4.0, False)
    assert p.chance(4.0, False) == pytest.approx(1 / (1 + np.exp(-(-4.0 + 2.0 * 2))))
    with pytest.raises(ValueError, match="slope"):
        InstabilityParams("bad", intercept=0.0, slope=-1.0, ramp_effect=0.0, depth=0.5)
    with pytest.raises(ValueError, match="depth"):
        InstabilityParams("bad", intercept=0.0, slope=1.0, ramp_effect=0.0, depth=0.0)


def test_models_load_from_their_file_or_folder(tmp_path):
    (tmp_path / "instability.json").write_text(json.dumps({"model": {**ALWAYS.__dict__, "fit_rmse": 1.0}}))
    assert load_instability(tmp_path) == ALWAYS
    assert load_instability(None) is None
    with pytest.raises(ValueError, match="fit_instability"):
        load_instability(tmp_path / "missing.json")


def _episode(guards):
    backend = SimBackend(
        "t4v100_4", "cifar10", "static_hetero", lr_rule="linear", instability=ALWAYS, guards=guards
    )
    env = HeteroClusterEnv(backend=backend, interval=50, action_mode="absolute", max_decisions=250)
    return run_episode(env, RecklessController(small=64, calm=20), seed=1)


def test_the_modelled_guards_roll_a_collapse_back_and_the_cap_costs_progress():
    wrecked = _episode(None)
    assert not wrecked.summary["reached_target"]
    assert wrecked.timeline[-1]["val_accuracy"] < 0.2
    saved = _episode({"max_lr_gain": None, "lr_ramp_iters": 0, "max_rollbacks": 1, "lr_backoff": 1.0})
    assert saved.summary["reached_target"], saved.timeline[-1]
    assert saved.summary["guard_rollbacks"] == 1
    fired = next(row for row in saved.timeline if row["guard_rollbacks"])
    assert "rolled back" in fired["events"] and fired["val_accuracy"] > 0.5
    # the cap: the rate a guarded run reaches is at most max_lr_gain x the base one
    capped = SimBackend("t4v100_4", "cifar10", "static_hetero", lr_rule="linear", guards={"max_lr_gain": 2.0})
    assert capped.sim.convergence.lr_multiplier(1024, 100.0) == 2.0
    assert (
        SimBackend("t4v100_4", "cifar10", lr_rule="linear").sim.convergence.lr_multiplier(1024, 100.0) > 2.0
    )


def test_training_worlds_draw_an_instability_from_absent_to_severe_without_moving_other_draws():
    from dynamix_gym.envs.randomized import DomainRandomization

    off = DomainRandomization(workers=4).sample(np.random.default_rng(5))
    on = DomainRandomization(workers=4, instability_probability=1.0).sample(np.random.default_rng(5))
    assert "instability" not in off
    assert {k: v for k, v in on.items() if k != "instability"} == off  # drawn after every other draw
    params = on["instability"]
    assert 2.0 <= 2 ** (-params.intercept / params.slope) <= 16.0 and -3.0 <= params.ramp_effect <= 0.0
    backend = SimBackend(**on)  # a world's config builds its backend, instability included
    assert backend.sim.instability is not None and backend.sim.instability.params == params
    with pytest.raises(ValueError, match=r"domain\.instability_probability"):
        DomainRandomization(workers=4, instability_probability=1.5)


def test_a_named_fallback_decides_in_the_env_after_a_rollback():
    """guards.fallback=<controller> on the env's path (a guarded SimBackend or DDPBackend): once the
    guards roll back, the named controller decides, not the policy (before, only "hold" was carried
    out there and a named fallback was silently the policy again)."""
    # on a rise, by the gain over the base rate: x4 (static 128 on 4 workers) ~ 1e-9, x64 (reckless) ~ 1
    steep = InstabilityParams("steep", intercept=-40.0, slope=10.0, ramp_effect=0.0, depth=1.0)
    backend = SimBackend(
        "t4v100_4", "cifar10", "static_hetero", lr_rule="linear", instability=steep,
        guards={"max_lr_gain": None, "lr_ramp_iters": 0, "max_rollbacks": 1, "lr_backoff": 1.0, "fallback": "static"},
    )  # fmt: skip
    env = HeteroClusterEnv(backend=backend, interval=50, action_mode="absolute", max_decisions=250)
    run = run_episode(env, RecklessController(small=64, calm=20), seed=1)
    assert run.summary["reached_target"] and run.summary["guard_rollbacks"] == 1
    fired = next(i for i, row in enumerate(run.timeline) if row["guard_rollbacks"])
    after = run.timeline[fired + 1 :]
    assert after and all(row[f"w{i}_batch"] == 128 for row in after for i in range(4))  # static's batch
    assert run.summary["guard_fallback_intervals"] >= len(after)
