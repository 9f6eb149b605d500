"""The observation-gap app: one real and one simulated episode of the same controller on the
committed fidelity profile, features ranked by their difference."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir
from support import ROOT

from dynamix_gym.obs import get_schema
from experiments.obs_gap import read_gap, run

# make test-slow: real ranks and simulated episodes end to end (13 s on two cores; make test ran
# 299-309 s against its 300 s budget); the committed report is results/fidelity/observation_gap.md
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def test_obs_gap_compares_every_feature_of_real_and_simulated_episodes(tmp_path):
    out = tmp_path / "gap.md"
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(
            "obs_gap",
            overrides=[
                f"profile={ROOT / 'results' / 'fidelity' / 'profile'}",
                "seeds=[0]",
                "steps=2",
                f"out={out}",
            ],
        )
    rows = run(cfg)
    assert {r["feature"] for r in rows} == set(get_schema("1").per_worker_names())
    gaps = [r["mean_abs_diff"] for r in rows]
    assert gaps == sorted(gaps, reverse=True) and all(math.isfinite(g) and 0 <= g <= 2 for g in gaps)
    # The workers' alive flags and the worker count mean the same on both backends.
    same = {r["feature"]: r["mean_abs_diff"] for r in rows}
    assert same["self.alive"] == 0 and same["global.num_workers"] == 0
    text = out.read_text()
    assert text.startswith("# Observation gap") and "python -m experiments.obs_gap" in text
    assert all(math.isfinite(r["first_decision_diff"]) and 0 <= r["first_decision_diff"] <= 2 for r in rows)
    assert "at the first decision" in text
    back = read_gap(out)
    assert [r["feature"] for r in back] == [r["feature"] for r in rows][: cfg.top]


def test_a_report_written_before_the_first_decision_column_still_reads(tmp_path):
    old = tmp_path / "old.md"
    old.write_text(
        "| feature | real mean | sim mean | mean abs difference |\n|---|---|---|---|\n| self.mem_util | -0.917 | -0.486 | 0.431 |\n"
    )
    (row,) = read_gap(old)
    assert row["mean_abs_diff"] == 0.431 and math.isnan(row["first_decision_diff"])
