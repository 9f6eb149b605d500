"""The schedule-fidelity app (experiments.schedules) on the simulated side: resumable, re-renderable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.schedules import schedule_library, schedules_app

CONF = Path(__file__).resolve().parents[2] / "conf"


def _cfg(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            "schedules",
            overrides=[
                "real=false",
                "sim_seeds=[0,1]",
                "time_budget_s=12",
                "schedules=[static-32,static-64,static-128,dec-128-32]",
                f"out_dir={tmp_path / 'out'}",
                f"report={tmp_path / 'schedules.md'}",
                "progress=false",
                *overrides,
            ],
        )


def test_simulated_campaign_resumes_and_rerenders(tmp_path):
    cfg = _cfg(tmp_path)
    schedules_app(cfg)
    schedules_app(cfg)  # resumes: nothing left to run
    runs = sorted((tmp_path / "out" / "runs").glob("*.json"))
    assert len(runs) == 2 * 2 * 4  # regimes x seeds x schedules
    meta = json.loads((tmp_path / "out" / "schedules.json").read_text())
    assert meta["ran"] == 0 and len(meta["conditions_history"]) == 2  # the second call measured nothing
    md = (tmp_path / "schedules.md").read_text()
    assert "## Learning-rate rule `none`" in md and "## Learning-rate rule `adascale`" in md
    assert (tmp_path / "schedules_none.png").stat().st_size > 0
    rec = json.loads(runs[0].read_text())
    assert rec["timeline"][-1]["wall_time_s"] >= 12.0  # no early stop: every run trains its budget
    schedules_app(_cfg(tmp_path, "reanalyse=true"))
    assert (tmp_path / "schedules.md").read_text() == md


def test_unknown_schedule_and_regime_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown names \['nope'\]"):
        schedule_library(_cfg(tmp_path, "schedules=[nope]"))
    with pytest.raises(ValueError, match="regimes must list"):
        schedules_app(_cfg(tmp_path, "regimes=[fast]"))


def test_fit_schedules_writes_a_loadable_refit_profile_and_its_report(tmp_path):
    schedules_app(_cfg(tmp_path))
    runs = tmp_path / "out" / "runs"
    for p in runs.glob("sim-*.json"):  # stand-ins for real runs: the simulator's own, relabelled
        rec = json.loads(p.read_text())
        (runs / p.name.replace("sim-", "real-", 1)).write_text(json.dumps({**rec, "backend": "real"}))
    from experiments.fit_schedules import fit_schedules_app
    from sim.profile import load_profile

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("fit_schedules", overrides=[
            f"runs_dir={tmp_path / 'out'}", f"out_profile={tmp_path / 'refit'}",
            f"report={tmp_path / 'fit.md'}", "fit_seeds=[0]", "same_day_step_times=true",
        ])  # fmt: skip
    held_rmse = fit_schedules_app(cfg)
    assert 0.0 <= held_rmse < 0.05  # seed 1's noise around the same model
    refit = load_profile(tmp_path / "refit")
    assert refit.workload == load_profile(CONF.parent / "results" / "fidelity" / "profile").workload
    assert "| held-out seeds |" in (tmp_path / "fit.md").read_text()
    assert not (tmp_path / "refit.tmp").exists()
    assert "Step times refitted from the campaign's own static real runs" in (tmp_path / "fit.md").read_text()
    assert refit.simulator["interval_overhead_s"] > 0


def test_step_time_check_compares_measured_compute_with_the_profile():
    from dynamix_gym.backends.sim_backend import SimBackend
    from experiments.reports.schedules import step_check_lines
    from experiments.schedules import quiet_scenario, step_time_check
    from sim.profile import load_profile

    profile = load_profile(CONF.parent / "results" / "fidelity" / "profile")
    backend = SimBackend(profile=profile, scenario=quiet_scenario(profile, 2))
    check = step_time_check(backend, profile, [16, 128], intervals=3, k=20)
    assert [r["local_batch"] for r in check["rows"]] == [16, 128]
    assert check["max_drift"] < 0.05  # the profile's own simulator: only its compute noise
    lines = step_check_lines([{"loads": []}, {"step_check": check}], {"step_time_rel": 0.10})
    assert any("within 10%" in line for line in lines)


RESULTS = CONF.parent / "results" / "fidelity"


@pytest.mark.parametrize(
    ("profile", "passes"),
    [("profile_schedules_sameday", True), ("profile", False)],
)
def test_the_same_day_refit_ranks_the_committed_real_schedules(tmp_path, profile, passes):
    """The committed real runs against the simulator in a profile (4 seeds): the same-day refit
    ranks the schedules as the real runs do in both learning-rate regimes (Kendall's tau >= 0.8),
    the shipped profile (before the refit) does not."""
    import shutil

    runs = tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    for p in (RESULTS / "schedules" / "runs").glob("real-*.json"):
        shutil.copy(p, runs / p.name)
    cfg = _cfg(tmp_path, "real=true", "sim_seeds=[0,1,2,3]", "time_budget_s=30", "schedules=null",
               f"sim_profile={RESULTS / profile}", "step_check.enabled=false")  # fmt: skip
    tau = schedules_app(cfg)
    assert (tau >= 0.8) is passes, tau
