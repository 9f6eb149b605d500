"""Controllers on held-out generated worlds (experiments.generated_eval): every controller drives
the same world per seed, ratios are over the reference's, bad settings are refused by name."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from support import CONF

from experiments.generated_eval import run, summary_table


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            "generated_eval", overrides=["workers=[2]", "seeds=[7000,7001]", "max_decisions=3", *overrides]
        )


def test_every_controller_drives_the_same_generated_world_and_is_scored_against_the_reference():
    cfg = _cfg(
        "domain_overrides={workloads: [ncf], compound_probability: 1.0}",
        "bundles={v5: results/policies/universal_v5, cost: {path: results/policies/universal_v5, split: balanced_cost}}",
    )
    df = run(cfg)
    assert sorted(df["label"].unique()) == ["cost", "oracle-tta", "v5"]
    worlds = df.groupby("seed")[["workload", "cluster", "scenario"]].nunique()
    assert (worlds == 1).all().all()  # one world per seed, whatever drives it
    assert set(df["workload"]) == {"ncf"} and all("+" in s for s in df["scenario"])  # the overrides act
    assert (df[df["label"] == "oracle-tta"]["ratio"] == 1.0).all()
    missed = df[~df["reached_target"]]
    assert (
        missed["score_s"] == 2.0 * missed["total_time_s"]
    ).all()  # 3 decisions: a missed target counts twice
    assert (df["ratio"] > 0).all()
    table = summary_table(df)
    assert "| v5 |" in table and "| cost |" in table and "ncf" in table


def test_bad_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"domain_overrides: unknown DomainRandomization fields \['gpus'\]"):
        run(_cfg("domain_overrides={gpus: 3}"))
    with pytest.raises(ValueError, match=r"bundles\.oracle-tta: the reference's label"):
        run(_cfg("bundles={oracle-tta: results/policies/universal}"))
    with pytest.raises(ValueError, match=r"bundles\.x: a mapping needs a path"):
        run(_cfg("bundles={x: {split: balanced}}"))
    with pytest.raises(ValueError, match=r"domain_from: .*does not exist"):
        run(_cfg("domain_from=/nonexistent"))
    with pytest.raises(ValueError, match=r"domain\.compound_probability"):
        run(_cfg("domain_overrides={compound_probability: 2.0}"))
