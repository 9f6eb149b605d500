"""The fidelity app's deployment verdicts (experiments.sim_to_real.deployment): medians with bootstrap
intervals, learned bundles over the best static batch, a fine-tuned bundle that was not kept read as
the bundle itself, collapses and guard counts, and the settings it refuses."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.sim_to_real.deployment import (
    calibrate_and_finetune,
    deployment_lines,
    deployment_summary,
    finetune_labels,
)

TARGETS = {"zero_shot_over_best_static": 1.0, "finetuned_over_best_static": 0.9}


def _spec(label: str, name: str, batch: int | None = None) -> dict:
    return {"label": label, "name": name, "kwargs": {}, "static": batch is not None, "batch": batch}


SPECS = [
    _spec("static-16", "static", 16),
    _spec("static-32", "static", 32),
    _spec("dlb", "dlb"),
    _spec("universal", "ppo"),
]


def _runs(tta: dict[str, list[float]], budget: float = 120.0) -> pd.DataFrame:
    rows = []
    for label, values in tta.items():
        for seed, v in enumerate(values):
            hit = np.isfinite(v)
            rows.append({
                "controller": label, "backend": "real", "seed": seed, "reached": bool(hit),
                "tta_s": v if hit else np.nan, "total_time_s": v if hit else budget,
                "guard_firings": 1 if label == "universal" and seed == 0 else 0,
                "guard_rollbacks": 1 if label == "universal" and seed == 0 else 0,
                "guard_time_lost_s": 0.5 if label == "universal" and seed == 0 else 0.0,
            })  # fmt: skip
            rows.append({**rows[-1], "backend": "sim", "tta_s": 1.0, "total_time_s": 1.0, "reached": True})
    return pd.DataFrame(rows)


def test_learned_over_best_static_with_intervals_and_a_finetune_not_kept():
    runs = _runs({
        "static-16": [10.0, 11.0, 12.0, 13.0],
        "static-32": [8.0, 9.0, 10.0, 11.0],  # the best static by median: 9.5
        "dlb": [20.0, 21.0, 22.0, np.inf],
        "universal": [7.0, 9.0, 10.0, np.inf],  # missed once: counts the budget, 120 s; median 9.5
    })  # fmt: skip
    collapsed = [{"controller": "universal", "seed": 3}]
    record = {"calibration": None, "finetune": {"universal": {
        "kept": False, "mean_tta_s": {"bundle": 5.0, "finetuned": 6.0}, "train": {"timesteps": 10, "train_seconds": 1.0},
        "finetuned": "x/final",
    }}}  # fmt: skip
    d = deployment_summary(runs, SPECS, collapsed, record, TARGETS)
    assert d["best_static"] == "static-32"
    per = d["per_controller"]
    assert per["universal"]["median_s"] == pytest.approx(9.5) and per["dlb"]["median_s"] == pytest.approx(
        21.5
    )
    assert per["universal"]["reached"] == 3 and per["universal"]["collapsed_for_good"] == 1
    assert per["universal"]["guard_rollbacks"] == 1 and per["universal"][
        "guard_time_lost_s"
    ] == pytest.approx(0.5)
    lo, hi = per["static-32"]["median_ci95"]
    assert 8.0 <= lo <= 9.5 <= hi <= 11.0
    zero, tuned = d["learned"]["universal"], d["learned"]["universal-ft"]
    assert (
        zero["median_over_best_static"] == pytest.approx(1.0)
        and zero["met"] is True
        and zero["target"] == 1.0
    )
    assert zero["ci95"][0] < 1.0 < zero["ci95"][1]
    # not kept: deploy finetune=true deploys the bundle itself, so its runs are the bundle's, held to 0.9
    assert tuned["runs_of"] == "universal" and tuned["median_over_best_static"] == pytest.approx(1.0)
    assert tuned["target"] == 0.9 and tuned["met"] is False
    assert d["collapses_learned"] == 1 and "dlb" not in d["learned"]
    text = "\n".join(deployment_lines(d))
    assert "| universal-ft (the runs of universal) | **1.000** |" in text and "(missed)" in text
    assert "not kept (universal-ft is universal)" in text


def test_finetune_names_ppo_controllers_and_needs_the_quick_calibration():
    assert finetune_labels(["universal"], SPECS) == ["universal"] and finetune_labels(None, SPECS) == []
    with pytest.raises(
        ValueError,
        match=r"finetune: 'dlb' is not a PPO controller of this run \(PPO labels: \['universal'\]\)",
    ):
        finetune_labels(["dlb"], SPECS)
    with pytest.raises(ValueError, match="finetune lists controller labels, got 3"):
        finetune_labels([3], SPECS)
    cfg = OmegaConf.create({"calibrate": {"quick": False}, "finetune": ["universal"], "finetuning": {}})
    with pytest.raises(ValueError, match=r"set calibrate.quick=true"):
        calibrate_and_finetune(cfg, None, {}, None, SPECS, 20, None)
    cfg = OmegaConf.create({"calibrate": {"quick": False}, "finetune": [], "finetuning": {}})
    profile = object()
    assert calibrate_and_finetune(cfg, profile, {}, None, SPECS, 20, None) == (
        profile, SPECS, {"calibration": None, "finetune": {}},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("opening", "first"),
    [
        (None, 32),
        ({"job": 32, "chosen": 8, "applied": True}, 8),
        ({"job": 32, "chosen": 8, "applied": False}, 32),
    ],
)
def test_a_kept_fine_tune_runs_from_the_opening_it_chose(opening, first):
    from experiments.sim_to_real.deployment import with_finetuned

    specs = [{**_spec("universal", "ppo"), "kwargs": {"path": "bundle"}, "initial_batch": 32}]
    kept = {"universal": {"kept": True, "finetuned": "tuned", "opening": opening}}
    out = with_finetuned(specs, kept)
    assert [(s["label"], s["kwargs"]["path"], s["initial_batch"]) for s in out] == [
        ("universal", "bundle", 32), ("universal-ft", "tuned", first),
    ]  # fmt: skip
    assert with_finetuned(specs, {"universal": {**kept["universal"], "kept": False}}) == specs
    lines = "\n".join(deployment_lines({
        "calibration": None, "per_controller": {}, "best_static": None, "learned": {},
        "finetune": {"universal": {
            "kept": True, "mean_tta_s": {"bundle": 20.0, "finetuned": 18.0}, "timesteps": 0, "seconds": 30.0,
            "finetuned": "tuned", "imitation": None,
            "opening": None if opening is None else {**opening, "expert_mean_tta_s": {"32": 22.0, "8": 20.5}},
        }},
    }))  # fmt: skip
    if opening is None:
        assert "opening" not in lines
    else:
        assert "from each local batch (32: 22.00 s, 8: 20.50 s): 8" in lines
        assert ("(not applied: the job's 32 stays)" in lines) is (not opening["applied"])
