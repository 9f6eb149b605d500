"""A bundle says which of its inputs it read far outside its training range."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from dynamix_gym.controllers.base import env_options
from dynamix_gym.controllers.bundle import PPOController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from sim.profile import load_profile

UNIVERSAL = "results/policies/universal"


def test_inputs_out_of_range_are_counted_per_decision_and_logged_when_most_are(caplog):
    ctrl = PPOController(UNIVERSAL, out_of_range_sd=6.0)
    env = HeteroClusterEnv(
        workers=4, scenario="static_hetero", action_mode=ctrl.action_mode, **env_options(ctrl)
    )
    ctrl.reset(env.backend.spec, np.random.default_rng(0))
    names = ctrl.schema.per_worker_names()
    rows = np.zeros((4, len(names)), dtype=np.float32)
    j, k = names.index("global.progress_gain"), names.index("self.idle_fraction")
    ctrl._count_out_of_range(rows)
    rows[2, j] = 6.0  # one worker's row is enough; 6 s.d. counts
    ctrl._count_out_of_range(rows)
    rows[0, k] = -5.9  # below the threshold: not counted
    ctrl._count_out_of_range(rows)
    rows[0, k] = -10.0
    ctrl._count_out_of_range(rows)
    text = "global.progress_gain (3 of 4); self.idle_fraction (1 of 4)"
    assert ctrl.out_of_range_text() == text and not caplog.records  # the drop-in's reading: no log
    with caplog.at_level(logging.WARNING, logger="dynamix_gym.controllers.bundle"):
        summary = ctrl.episode_summary()
    assert summary == {"inputs_out_of_range": text}
    # only the input out of range at half the decisions or more is logged
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "global.progress_gain (3 of 4)" in warned and "idle_fraction" not in warned
    ctrl.reset(env.backend.spec, np.random.default_rng(0))  # a new episode starts from zero
    assert ctrl.episode_summary() == {"inputs_out_of_range": ""}
    with pytest.raises(ValueError, match="out_of_range_sd"):
        PPOController(UNIVERSAL, out_of_range_sd=0.0)


def test_the_universal_bundle_reads_the_real_lm_task_outside_its_training_range():
    """On the LM campaign's refit the runs reach the target in a few dozen decisions; the universal
    bundle, trained on runs of hundreds, reads its progress gain ~10 s.d. out there (at 4 of its 10
    decisions in this run; in its training data an input lies 6 s.d. out at ~1 % of decisions), and
    the summary says so, that input first."""
    ctrl = PPOController(UNIVERSAL)
    env = HeteroClusterEnv(
        profile=load_profile("results/deploy/lm_11/profile_refit"),
        scenario="static_hetero",
        initial_batch=32,
        action_mode=ctrl.action_mode,
        interval=20,
        **env_options(ctrl),
    )
    summary = run_episode(env, ctrl, seed=0).summary
    first = summary["inputs_out_of_range"].split("; ")[0]
    name, count = first.split(" (")
    hits, seen = (int(x) for x in count.rstrip(")").split(" of "))
    assert name == "global.progress_gain" and seen == summary["decisions"] and 3 * hits >= seen
