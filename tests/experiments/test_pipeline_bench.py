"""experiments.pipeline: the bench row over one tiny task, and merging runs of disjoint scenarios."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from experiments.pipeline import run


def cfg(tmp_path, **over):
    base = OmegaConf.load("conf/pipeline.yaml")
    base = OmegaConf.merge(
        {k: v for k, v in base.items() if k != "defaults"},
        {"seeds_per_scenario": 1, "interval": 50, "limit": False, "controllers": ["even", "greedy_gain"]},
        over,
    )
    return base


def test_runs_of_disjoint_scenarios_merge_into_one_summary(tmp_path):
    a = run(cfg(tmp_path, scenarios=["throttle"], out=str(tmp_path / "a.json")))
    b = run(cfg(tmp_path, scenarios=["jitter"], out=str(tmp_path / "b.json")))
    merged = run(cfg(tmp_path, merge_from=[str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                     out=str(tmp_path / "m.json")))  # fmt: skip
    assert merged["rows"] == a["rows"] + b["rows"]
    assert merged["summary"]["tasks"] == 2
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["tasks"] == 2
    with pytest.raises(ValueError, match="share"):
        run(cfg(tmp_path, merge_from=[str(tmp_path / "a.json")] * 2, out=str(tmp_path / "x.json")))
