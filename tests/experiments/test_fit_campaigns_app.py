"""The campaign refit app (experiments.fit_campaigns): earlier campaigns' real runs in, a refitted
profile and its report out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from experiments.fit_campaigns import campaign_dirs, fit_campaigns_app, load_campaign_runs
from sim.convergence import ConvergenceModel
from sim.fitting.schedules import ScheduleRun, calibration_runs, replay, rmse, trained, with_target_vector
from sim.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
PROFILE = ROOT / "results" / "lm" / "profile_2"
TARGET = 0.77
SCHEDULES = {
    "static-8": [16] * 30,
    "static-32": [64] * 30,
    "universal-ft": [16, 24, 72, 30, 30, 30] + [18] * 24,
    "dlb": [128, 128, 64] + [16] * 27,
}


def _truth():
    prof = load_profile(PROFILE)
    return with_target_vector(
        prof.convergence_params(prof.workload.convergence), [1.1, 0.1, np.log(80.0), np.log(2.0)]
    )


def _campaign(root: Path, name: str, seeds=(0, 1), target=TARGET, rolled_back=False) -> Path:
    """A campaign's out_dir whose real runs follow a known model (and a simulated copy, not fitted)."""
    model, rows = ConvergenceModel(_truth(), "adascale"), []
    model.max_gain = 2.0
    rng = np.random.default_rng(len(name))
    for ctl, gb in SCHEDULES.items():
        acc = replay(model, ScheduleRun(ctl, "adascale", 0, 20, np.array(gb, float), np.zeros(len(gb))))
        for seed in seeds:
            a = acc + rng.normal(0.0, 2e-5, len(acc))  # the seeds apart, well within a step near the target
            end = int(np.flatnonzero(a >= TARGET)[0]) + 1
            for backend in ("real", "sim"):
                for step in range(end):
                    rows.append({"controller": ctl, "backend": backend, "seed": seed, "step": step,
                                 "global_batch": gb[step], "val_accuracy": a[step] if backend == "real" else 0.5,
                                 "guard_rollbacks": float(rolled_back and ctl == "dlb" and step == 2)})  # fmt: skip
    out = root / name
    out.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(out / "timelines.csv", index=False)
    (out / "summary.json").write_text(json.dumps({"setup": {"interval": 20, "target_accuracy": target}}))
    return out


def _cfg(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("fit_campaigns", overrides=[
            f"profile={PROFILE}", f"campaigns=[{tmp_path}/c_*]", f"out_profile={tmp_path / 'refit'}",
            f"report={tmp_path / 'fit.md'}", "grid=false", *overrides,
        ])  # fmt: skip


def test_the_refit_profile_predicts_the_held_out_campaign(tmp_path):
    for i in (1, 2, 10):
        _campaign(tmp_path, f"c_{i}", rolled_back=i == 2)
    assert [p.name for p in campaign_dirs([f"{tmp_path}/c_*"])] == ["c_1", "c_2", "c_10"]  # natural order
    scores = fit_campaigns_app(_cfg(tmp_path, f"held_out=[{tmp_path}/c_10]"))
    assert scores["held_after"] < 0.02 < scores["held_before"]
    assert scores["fit_after"] < scores["fit_before"]
    refit = load_profile(tmp_path / "refit")
    params = refit.convergence_params(refit.workload.convergence)
    assert params.stretch_exponent < 0.25 and params.progress_noise_factor < 5  # toward the truth (0.1, 2)
    assert refit.workload == load_profile(PROFILE).workload
    text = (tmp_path / "fit.md").read_text()
    assert "Left out: 2 rolled back; 0 never reached the target." in text  # c_2's dlb, both seeds
    assert "Held-out campaigns:" in text and "| universal-ft | 2 |" in text
    assert not (tmp_path / "refit.tmp").exists()
    # the profile's own static curves, re-scored under the refit beside the profile's model
    curves = trained(calibration_runs(PROFILE / "curves.csv"))
    before = load_profile(PROFILE).convergence_params(refit.workload.convergence)
    row = f"| accuracy RMSE (points), every interval | {len(curves)} | {100 * rmse(before, curves):.2f} | "
    assert curves and row + f"{100 * rmse(params, curves):.2f} |" in text


def test_the_runs_of_one_campaign_are_the_real_ones_that_reached_the_target(tmp_path):
    path = _campaign(tmp_path, "c_1", seeds=(0,), rolled_back=True)
    runs, left = load_campaign_runs(path, "adascale")
    assert sorted(r.name for r in runs) == ["c_1:static-32", "c_1:static-8", "c_1:universal-ft"]
    assert left == {"rolled back": 1, "never reached the target": 0}
    assert all(r.iterations == 20 and r.val_accuracy.max() >= TARGET for r in runs)


def test_bad_input_is_refused_by_name(tmp_path):
    _campaign(tmp_path, "c_1")
    _campaign(tmp_path, "c_2", target=0.75)
    with pytest.raises(ValueError, match="different targets"):
        fit_campaigns_app(_cfg(tmp_path))
    with pytest.raises(FileNotFoundError, match="matches no directory"):
        fit_campaigns_app(_cfg(tmp_path, f"campaigns=[{tmp_path}/nothing_*]"))
    with pytest.raises(ValueError, match="no campaign left to fit on"):
        fit_campaigns_app(_cfg(tmp_path, f"campaigns=[{tmp_path}/c_1]", f"held_out=[{tmp_path}/c_1]"))
    (tmp_path / "c_3").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no timelines\.csv"):
        fit_campaigns_app(_cfg(tmp_path, f"campaigns=[{tmp_path}/c_3]"))
    assert not (tmp_path / "refit").exists() and not (tmp_path / "fit.md").exists()
