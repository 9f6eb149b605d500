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
    # a miss (saved as null) is read back as inf: force one and the summary still forms
    rows = json.loads((tmp_path / "a.json").read_text())
    rows["rows"][0]["time_to_target_s"] = None
    (tmp_path / "a.json").write_text(json.dumps(rows))
    again = run(cfg(tmp_path, merge_from=[str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                    out=str(tmp_path / "m2.json")))  # fmt: skip
    c = rows["rows"][0]["controller"]
    assert again["summary"]["reached"][c] == merged["summary"]["reached"][c] - 1
    assert merged["summary"]["tasks"] == 2
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["tasks"] == 2
    with pytest.raises(ValueError, match="share"):
        run(cfg(tmp_path, merge_from=[str(tmp_path / "a.json")] * 2, out=str(tmp_path / "x.json")))
