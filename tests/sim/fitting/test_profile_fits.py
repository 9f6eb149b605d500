"""Calibration fitting: known parameters come back from synthetic measurements, ill-formed tables are
refused with a message naming column, row and range, and a profile plugs into the simulator."""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import run_app

from dynamix_gym.backends.sim_backend import SimBackend
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.measurement.profiling import profile_ladder, reference_rows
from sim import profile as calib
from sim.cluster import ClusterSpec, ProfiledNodeSpec
from sim.convergence import ConvergenceModel, convergence_params
from sim.engine import Simulator
from sim.faults import Scenario
from sim.fitting.curves import Curve, fit_convergence_curves
from sim.fitting.hardware import fit_all
from sim.fitting.step_time import holdout_errors, step_time_s
from sim.fitting.table import read_profile_table
from sim.fitting.tradeoff import progress_to_accuracy, steps_to_progress
from sim.hardware import ComputeParams
from sim.network import CommParams
from sim.profile import ClusterProfile, load_profile, write_profile
from sim.workloads import Workload

TRUE_COMPUTE = ComputeParams(
    gpu="cpu-test", app="toy", alpha_s=0.0005, beta_s=6e-5, exponent=1.0, host_s=0.004, k=8.0, max_batch=512
)
TRUE_COMM = CommParams(
    gpu="cpu-test",
    app="toy",
    alpha_intra_s=0.003,
    beta_intra_s=0.001,
    alpha_inter_s=0.003,
    beta_inter_s=0.001,
    gamma=1.5,
)
LADDER = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
NO_NOISE = Scenario(name="quiet", compute_noise_cv=0.0, measurement_noise_cv=0.0)


def synthetic_table(noise: float = 0.01, seed: int = 0, workers: tuple[int, ...] = (1, 2, 4)) -> pd.DataFrame:
    """Step times of TRUE_COMPUTE / TRUE_COMM over LADDER x workers, with log-normal noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in workers:
        for b in LADDER:
            step = float(step_time_s(TRUE_COMPUTE, TRUE_COMM, b, w)) * math.exp(noise * rng.standard_normal())
            comp = float(step_time_s(TRUE_COMPUTE, None, b, 1))
            rows.append({
                "gpu": "cpu-test", "app": "toy", "placement": str(w), "num_nodes": 1, "num_gpus": w,
                "local_batch": b, "step_time_s": step, "sync_time_s": 0.0 if w == 1 else max(step - comp, 0.0),
            })  # fmt: skip
    return pd.DataFrame(rows)


def toy_workload(**kw) -> Workload:
    base = dict(
        name="toy", model="toy", app="toy", convergence="cifar10", params_millions=0.02,
        app_params_millions=0.02, samples_per_epoch=1437, target_accuracy=0.9, num_classes=10,
        val_samples=359, initial_local_batch=32, time_budget_s=120.0,
    )  # fmt: skip
    return Workload(**{**base, **kw})


def toy_profile(path: Path, workers: int = 2, **simulator) -> ClusterProfile:
    cluster = ClusterSpec("toy2", (ProfiledNodeSpec(gpu="cpu-test", gpus=workers, cpu_cores=2, mem_gib=4.0),))
    return write_profile(
        path, name="toy2", cluster=cluster, workload=toy_workload(), computes=[TRUE_COMPUTE], comms=[TRUE_COMM],
        simulator={"min_batch": 8, **simulator},
    )  # fmt: skip


# --- fitting recovers what generated the data ------------------------------------------------------


def test_fit_recovers_known_compute_and_comm_parameters():
    computes, comms, _ = fit_all(synthetic_table(noise=0.005))
    (c,), (m,) = computes, comms
    assert c.exponent == 1.0  # the simpler model is kept when a free exponent does not help
    assert c.beta_s == pytest.approx(TRUE_COMPUTE.beta_s, rel=0.05)
    assert c.host_s == pytest.approx(TRUE_COMPUTE.host_s, rel=0.1)  # the floor at small batches
    assert c.alpha_s == pytest.approx(TRUE_COMPUTE.alpha_s, abs=5e-4)
    assert m.alpha_intra_s == pytest.approx(TRUE_COMM.alpha_intra_s, rel=0.2)
    assert m.beta_intra_s == pytest.approx(TRUE_COMM.beta_intra_s, rel=0.2)
    b = np.array(LADDER, dtype=np.float64)
    for w in (1, 2, 4):
        true = step_time_s(TRUE_COMPUTE, TRUE_COMM, b, w)
        assert np.max(np.abs(step_time_s(c, m, b, w) / true - 1)) < 0.03


def test_holdout_predicts_held_out_batches_within_the_noise():
    h = holdout_errors(synthetic_table(noise=0.01), every=2)
    assert h["held_out_batches"] == [12, 24, 48, 96, 192, 384]
    assert 512 in h["fit_batches"] and 8 in h["fit_batches"]
    assert set(h["mdape"]) == {"cpu-test"}
    assert h["mdape"]["cpu-test"] < 0.03
    assert len(h["rows"]) == 6 * 3


def test_calibrating_the_simulator_against_itself_recovers_its_models(tmp_path):
    """The profiling loop drives any backend: on a noise-free simulated cluster, the fitted models
    predict the profile's own step times."""
    toy_profile(tmp_path / "truth")
    backends = {
        w: SimBackend(ClusterSpec("t", (ProfiledNodeSpec(gpu="cpu-test", gpus=w, mem_gib=4.0),)), scenario=NO_NOISE,
                      profile=tmp_path / "truth")
        for w in (1, 2, 3)
    }  # fmt: skip
    ladder = profile_ladder(
        backends, LADDER[::2], iterations=5, repeats=2, warmup_iterations=2, progress=False
    )
    assert not ladder.stopped_early and len(ladder.points) == 7 * 3
    computes, comms, _ = fit_all(read_profile_table(pd.DataFrame(reference_rows(ladder, "toy", "toy"))))
    b = np.array(LADDER, dtype=np.float64)
    for w in (1, 2, 3):
        pred = step_time_s(computes[0], comms[0], b, w)
        assert np.max(np.abs(pred / step_time_s(TRUE_COMPUTE, TRUE_COMM, b, w) - 1)) < 0.02


def test_profile_ladder_stops_at_its_budget_and_says_what_it_skipped(tmp_path, monkeypatch):
    toy_profile(tmp_path / "p")
    clock = {"t": 0.0}
    monkeypatch.setattr("dynamix_gym.measurement.profiling.time.monotonic", lambda: clock["t"])
    backend = SimBackend(scenario=NO_NOISE, profile=tmp_path / "p")
    run = backend.run_interval

    def slow_run(batches, iterations):  # every interval "takes" 1 s per 100 samples of local batch
        clock["t"] += max(batches) / 100.0
        return run(batches, iterations)

    backend.run_interval = slow_run
    res = profile_ladder({2: backend}, [8, 64, 256, 512], repeats=1, budget_s=10.0, progress=False)
    assert res.stopped_early
    assert [p["local_batch"] for p in res.points] == [8, 64, 256]
    assert res.skipped == [(2, 512)]
    assert "OUT OF TIME" in res.message() and "2x512" in res.message()


def test_convergence_model_is_recovered_from_curves_it_generated():
    true = replace(convergence_params("cifar10"), name="toy_conv")
    model = ConvergenceModel(true, "adascale")
    curves = []
    for m in (128, 512, 2048):
        p, steps, prog = 0.0, [], []
        while p < 12_000:  # an interval of 25 steps at a time, as a backend reports them
            for _ in range(25):
                p += model.progress_per_step(m, p)
            steps.append(25.0 * (len(steps) + 1))
            prog.append(p)
        prog = np.array(prog)
        g2 = np.array([model.grad_stats(x)[0] for x in prog])
        gv = np.array([model.grad_stats(x)[1] for x in prog])
        acc = model.accuracy_many(prog, math.log2(m))
        curves.append(Curve(m, np.array(steps), prog, acc, g2, gv))
    fit = fit_convergence_curves(
        curves, name="toy_conv", base_batch=true.base_batch, acc_chance=0.1, targets=[0.85]
    )
    assert fit.rmse_raw < 0.01
    fitted = ConvergenceModel(fit.params, "adascale")
    for m in (128, 512, 2048):
        p_true = progress_to_accuracy(model, m, 0.85)
        p_fit = progress_to_accuracy(fitted, m, 0.85)
        assert steps_to_progress(fitted, m, p_fit) == pytest.approx(
            steps_to_progress(model, m, p_true), rel=0.1
        )


def test_a_split_progress_noise_is_recovered_from_curves_it_generated():
    """A task whose reported noise scale is small (AdaScale barely raises its rate) but whose larger
    batches still need fewer steps: the fit finds the progress noise factor, and the steps to target."""
    base = convergence_params("cifar10")
    low = replace(base, name="toy_split", log_grad_var=tuple(v - math.log(100.0) for v in base.log_grad_var))
    true = replace(low, progress_noise_factor=100.0)
    model = ConvergenceModel(true, "adascale")
    curves = []
    for m in (128, 512, 2048):
        p = q = 0.0
        steps, prog, qs = [], [], []
        while p < 12_000:
            dp, dq = model.advance(m, p, q, 25.0)
            p, q = p + dp, q + dq
            steps.append(25.0 * (len(steps) + 1))
            prog.append(q)  # what a real backend sums: AdaScale's gain at its estimated noise scale
            qs.append(p)
        g2 = np.array([model.grad_stats(x)[0] for x in prog])
        gv = np.array([model.grad_stats(x)[1] for x in prog])
        acc = model.accuracy_many(np.array(qs), math.log2(m))
        curves.append(Curve(m, np.array(steps), np.array(prog), acc, g2, gv))
    kwargs = {"name": "toy_split", "base_batch": true.base_batch, "acc_chance": 0.1, "targets": [0.85]}
    fit = fit_convergence_curves(curves, **kwargs, refit_targets=[0.8, 0.85])
    assert fit.params.progress_noise_factor > 10.0, fit.notes
    fitted = ConvergenceModel(fit.params, "adascale")
    errors = []
    for m in (128, 512, 2048):
        want = steps_to_progress(model, m, progress_to_accuracy(model, m, 0.85))
        errors.append(steps_to_progress(fitted, m, progress_to_accuracy(fitted, m, 0.85)) / want - 1.0)
    assert max(abs(e) for e in errors) < 0.1, (errors, fit.notes)


# --- the profile plugs into the simulator, backend and env -----------------------------------------


def test_profile_supplies_cluster_workload_models_and_overheads(tmp_path):
    prof = toy_profile(tmp_path / "p", interval_overhead_s=0.05, reconfig_delay_s=0.02)
    sim = Simulator(scenario=NO_NOISE, profile=tmp_path / "p")
    assert sim.cluster.gpu_types == ("cpu-test", "cpu-test") and sim.workload.name == "toy"
    assert sim.min_batch.tolist() == [8, 8] and sim.max_batch.tolist() == [512, 512]
    sim.reset(seed=0)
    r1 = sim.run_interval([64, 64], 10)
    expected_iter = float(step_time_s(TRUE_COMPUTE, TRUE_COMM, 64, 2))
    assert r1.interval_time_s == pytest.approx(10 * expected_iter + 0.05, rel=1e-9)
    r2 = sim.run_interval([64, 128], 10)  # a batch changed: the reconfiguration delay too
    assert r2.reconfig_time_s == 0.02
    assert r2.interval_time_s == pytest.approx(
        10 * sim.iteration_time_s(np.array([64, 128])) + 0.07, rel=1e-9
    )
    # explicit arguments win over the profile's settings
    assert Simulator(profile=prof, interval_overhead_s=0.0, min_batch=16).interval_overhead_s == 0.0
    env = HeteroClusterEnv(profile=str(tmp_path / "p"), scenario=NO_NOISE, interval=5)
    _, info = env.reset(seed=0)
    assert env.num_workers == 2 and info["report"].truth is not None
    # shipped GPU types still resolve through a profile (the profile's models come first)
    assert Simulator("t4v100", "cifar10", profile=prof).cluster.num_workers == 8


def test_profile_by_name_is_looked_up_in_the_profiles_directory(tmp_path, monkeypatch):
    root = tmp_path / "data"
    toy_profile(root / "profiles" / "toy2")
    monkeypatch.setattr(calib, "data_path", lambda name: root / name)
    assert load_profile("toy2").cluster.name == "toy2"
    with pytest.raises(FileNotFoundError, match="cluster profile 'nope' not found"):
        load_profile("nope")


def test_profile_errors_name_what_is_missing(tmp_path):
    toy_profile(tmp_path / "p")
    doc = (tmp_path / "p" / "profile.json").read_text()
    (tmp_path / "p" / "profile.json").write_text(
        doc.replace('"mem_gib"', '"x"').replace('"cpu-test": 4.0', '"other": 4.0')
    )
    with pytest.raises(ValueError, match=r"worker type 'cpu-test'.*gpu_memory_gib"):
        load_profile(tmp_path / "p")
    (tmp_path / "p" / "profile.json").write_text(doc.replace('"profile_format": 1', '"profile_format": 9'))
    with pytest.raises(ValueError, match="profile_format 9"):
        load_profile(tmp_path / "p")
    (tmp_path / "p" / "profile.json").write_text(doc)
    (tmp_path / "p" / "comm_models.json").write_text('{"models": []}')
    with pytest.raises(ValueError, match=r"no communication model for \(cpu-test, toy\)"):
        load_profile(tmp_path / "p")
    with pytest.raises(ValueError, match="workers= builds the default"):
        SimBackend(workers=4, profile=tmp_path / "p")


# --- the app's table mode --------------------------------------------------------------------------


def _calibrate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_app("experiments.calibrate", "progress=false", *args, timeout=timeout)


@pytest.mark.integration
def test_calibrate_fits_a_table_in_the_reference_format_into_a_loadable_profile(tmp_path):
    csv = tmp_path / "toy.csv"
    synthetic_table().to_csv(csv, index=False)
    out = tmp_path / "profile"
    proc = _calibrate(
        f"table={csv}", f"out_dir={out}", "name=toy", "+gpu_memory_gib.cpu-test=4", "workload.name=toy"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    prof = load_profile(out)
    assert prof.cluster.gpu_types == ("cpu-test",) * 4  # one node of the table's largest placement
    c = prof.compute[("cpu-test", "toy")]
    assert c.beta_s == pytest.approx(TRUE_COMPUTE.beta_s, rel=0.1)
    assert "Held-out step times" in (out / "calibration.md").read_text()
    assert read_profile_table(out / "measurements.csv").shape[0] == len(LADDER) * 3
    sim = Simulator(scenario=NO_NOISE, profile=out)
    sim.reset(seed=0)
    assert sim.run_interval(np.full(4, 64), 5).iteration_time_s[0] > 0


@pytest.mark.integration
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.drop(columns=["sync_time_s"]), r"lacks required column\(s\) \['sync_time_s'\]"),
        (lambda d: d.assign(step_time_s=d["step_time_s"].where(d.index != 3, -0.5)),
         r"step_time_s in row 4 \(line 5\) of bad.csv must be in \(0, inf\), got -0.5"),
        (lambda d: d.assign(sync_time_s=d["sync_time_s"].where(d.index != 20, 9.0)),
         r"sync_time_s in row 21 \(line 22\) of bad.csv \(at most step_time_s\) must be in \[0, "),
        (lambda d: d.assign(local_batch=d["local_batch"].astype(float).where(d.index != 0, 8.5)),
         r"local_batch in row 1 \(line 2\) of bad.csv must be an integer >= 1, got 8.5"),
        (lambda d: d.assign(num_gpus=d["num_gpus"].where(d.index != 15, 3)),
         r"num_gpus in row 16 \(line 17\) of bad.csv must equal the sum of the digits of placement '2'"),
    ],
)  # fmt: skip
def test_calibrate_rejects_ill_formed_tables_naming_column_row_and_range(tmp_path, edit, message):
    bad = tmp_path / "bad.csv"
    edit(synthetic_table()).to_csv(bad, index=False)
    with pytest.raises(ValueError, match=message):
        read_profile_table(bad)
    proc = _calibrate(f"table={bad}", f"out_dir={tmp_path / 'out'}")
    assert proc.returncode != 0
    assert re.search(message, proc.stderr), proc.stderr[-2000:]
    assert not (tmp_path / "out" / "profile.json").exists()
