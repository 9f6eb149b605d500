"""The gradient-spread fit (experiments.fit_grad_spread): it recovers a spread the simulator drew,
writes it into a profile that the simulator then reads, and refuses what it cannot fit."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.fit_grad_spread import estimator_bias, fit_spread, interval_iterations, intervals
from sim.convergence import ConvergenceModel
from sim.engine import Simulator
from sim.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
LM_PROFILE = ROOT / "results" / "lm" / "profile_2"


def _timelines(params, batches, seeds=(0, 1, 2, 3), intervals_per_run=12, k=20, backend="real"):
    """Timelines rows (the fidelity app's columns) of static runs simulated with ``params``."""
    rows = []
    for b in batches:
        for seed in seeds:
            sim = Simulator(profile=LM_PROFILE, scenario="static_hetero", convergence_params=params)
            sim.reset(seed=seed)
            for j in range(intervals_per_run):
                r = sim.run_interval(np.full(sim.num_workers, b), k)
                row = {"controller": f"static-{b}", "backend": backend, "seed": seed, "step": j}
                for i in range(sim.num_workers):
                    row |= {f"w{i}_batch": b, f"w{i}_grad_norm_mean": r.grad_norm_mean[i],
                            f"w{i}_grad_norm_var": r.grad_norm_var[i]}  # fmt: skip
                rows.append(row)
    return pd.DataFrame(rows)


def test_the_fit_recovers_a_spread_the_simulator_drew():
    base = load_profile(LM_PROFILE).convergence_params("pystdlib_lm")
    truth = replace(base, grad_norm_cv=0.25, grad_norm_cv_exponent=0.15)
    tl = _timelines(truth, (8, 32, 128))
    d = intervals(tl, "real", skip_first=1)
    assert len(d) == 3 * 4 * 11 * 2 and (d.k >= 1).all()
    fit = fit_spread(d, base.base_batch, 20, np.random.default_rng(0))
    assert fit["grad_norm_cv"] == pytest.approx(0.25, rel=0.05)
    assert fit["grad_norm_cv_exponent"] == pytest.approx(0.15, abs=0.04)
    assert 0.9 < fit["estimator_bias"] < 1.0  # 20 iterations: the sample cv runs a few % low
    assert estimator_bias(0.25, 1000, np.random.default_rng(0)) == pytest.approx(1.0, abs=0.01)


def test_the_app_writes_the_spread_into_the_profile_and_the_simulator_reads_it(tmp_path):
    from support import run_app

    prof = tmp_path / "profile"
    shutil.copytree(LM_PROFILE, prof)
    base = load_profile(prof).convergence_params("pystdlib_lm")
    csv = tmp_path / "timelines.csv"
    (tmp_path / "summary.json").write_text(json.dumps({"setup": {"interval": 20}}))  # the campaign's K
    assert interval_iterations([csv], None) == 20 and interval_iterations([csv], 50) == 50
    _timelines(replace(base, grad_norm_cv=0.4, grad_norm_cv_exponent=-0.1), (8, 64), seeds=(0, 1)).to_csv(
        csv, index=False
    )
    proc = run_app("experiments.fit_grad_spread", f"timelines=[{csv}]", f"profile={prof}",
                   f"hydra.run.dir={tmp_path / 'h'}", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    fitted = load_profile(prof).convergence_params("pystdlib_lm")
    assert fitted.grad_norm_cv == pytest.approx(0.4, rel=0.08)
    assert fitted.grad_norm_cv_exponent == pytest.approx(-0.1, abs=0.05)
    report = json.loads((prof / "grad_spread.json").read_text())
    assert report["rmse_log_cv_power_law"] > 0 and report["before"]["grad_norm_cv"] == base.grad_norm_cv
    assert "fitted to real ranks" in (prof / "grad_spread.md").read_text()
    assert ConvergenceModel(fitted).grad_norm_cv_at(np.array([8]))[0] == pytest.approx(
        fitted.grad_norm_cv * (8 / base.base_batch) ** fitted.grad_norm_cv_exponent
    )
    doc = json.loads((prof / "profile.json").read_text())
    assert doc["provenance"]["refits"][-1]["what"] == "gradient spread fitted to real timelines"


def test_timelines_without_gradient_statistics_or_k_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"iterations: .*summary\.json is missing"):
        interval_iterations([tmp_path / "timelines.csv"], None)
    tl = pd.DataFrame({"controller": ["a"], "backend": ["real"], "seed": [0], "step": [20], "w0_batch": [8]})
    with pytest.raises(ValueError, match="grad_norm_var"):
        intervals(tl, "real", 1)
