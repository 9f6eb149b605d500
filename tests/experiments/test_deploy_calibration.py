"""Calibrate right before the run: the drift check with synthetic profiles, the quick ladder and
refit against a simulated machine, the settings' ranges, and (integration) a short ladder on 2 CPU ranks."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from support import ROOT, UNIVERSAL_BUNDLE, run_python

from adapters.config import RealDDPConfig
from dynamix_gym.backends.sim_backend import SimBackend
from experiments.calibration.fit import refit_compute_knee
from experiments.deploy_calibration import (
    RECORD_FILE,
    REFIT_DIR,
    REPORT_FILE,
    ProfileDriftError,
    QuickCalibration,
    check_ranks,
    quick_calibrate,
    stored_profile,
)
from sim.faults import Scenario
from sim.fitting.step_time import measured_drift, step_time_drift, step_time_s
from sim.hardware import ComputeParams
from sim.profile import load_profile

PROFILE = ROOT / "results" / "fidelity" / "profile"  # 2 CPU ranks, MNIST CNN (experiments.calibrate)
KEY = ("cpu", "mnist_cnn")
FAST = QuickCalibration(quick=True, batches=(16, 32, 64, 128, 192, 256, 320), progress=False)
K = 10  # iterations per decision interval of the overhead measurement


def _line(alpha_s: float = 2e-3, beta_s: float = 3e-4, **kw) -> ComputeParams:
    """T(b) = alpha + beta * b (+ a knee): host_s 0, k 1, so the step time of one replica is T(b)."""
    return ComputeParams("cpu", "mnist_cnn", alpha_s, beta_s, 1.0, 0.0, 1.0, 512, **kw)


def _with_compute(profile, params: ComputeParams):
    return replace(profile, compute={**profile.compute, KEY: params})


# --- the drift check, synthetic profiles ---------------------------------------------------------
def test_identical_models_do_not_drift():
    p = load_profile(PROFILE)
    models = (p.compute[KEY], p.comm[KEY])
    d = step_time_drift(models, models, [16, 64, 256], replicas=2)
    assert d["max_drift"] == 0.0 and [r["drift"] for r in d["rows"]] == [0.0, 0.0, 0.0]


def test_a_uniformly_slower_machine_drifts_by_its_slow_down():
    stored, slower = _line(), _line(2e-3 * 1.25, 3e-4 * 1.25)  # this machine is 25% slower now
    d = step_time_drift((stored, None), (slower, None), [16, 64, 256], replicas=1)
    assert d["max_drift"] == pytest.approx(0.2, abs=1e-12)  # stored / refit - 1 = 1 / 1.25 - 1
    assert all(r["drift"] == pytest.approx(-0.2, abs=1e-12) for r in d["rows"])


def test_a_knee_only_drifts_past_it():
    stored, knee = _line(), _line(knee_batch=192.0, knee_beta_s=5e-4)
    d = step_time_drift((stored, None), (knee, None), [32, 128, 192, 256, 320], replicas=1)
    by_batch = {r["local_batch"]: r["drift"] for r in d["rows"]}
    assert by_batch[32] == by_batch[128] == by_batch[192] == 0.0
    assert by_batch[320] < by_batch[256] < 0.0  # the stored profile is too fast past the knee
    assert d["worst_batch"] == 320 and d["max_drift"] == pytest.approx(-by_batch[320])


# --- the whole quick calibration against a simulated machine ---------------------------------------
class SimulatedRanks(SimBackend):
    """Ranks whose step times are those of ``profile``: the simulator, noise-free, equal speeds."""

    def __init__(self, profile) -> None:
        quiet = Scenario(
            name="quiet", worker_speed=(1.0, 1.0), compute_noise_cv=0.0, measurement_noise_cv=0.0
        )
        super().__init__(profile=profile, scenario=quiet)
        self.config = RealDDPConfig(workers=2)


def test_a_machine_as_stored_is_accepted_and_the_refit_written(tmp_path):
    stored = load_profile(PROFILE)
    record = quick_calibrate(SimulatedRanks(stored), stored, FAST, tmp_path, seed=0, interval=K)
    assert record["verdict"] == "accepted" and record["drift"]["max_drift"] < 0.10
    assert [m["local_batch"] for m in record["measured"]] == [16, 32, 64, 128, 192, 256, 320]
    refit = load_profile(tmp_path / REFIT_DIR)
    assert refit.workload == stored.workload
    assert (
        refit.comm == stored.comm and record["comm_refit"]["fit"]["kept_stored"]
    )  # the all-reduce is as stored
    assert refit.compute[KEY].exponent == 1.0 and refit.compute[KEY] != stored.compute[KEY]
    assert json.loads((tmp_path / REFIT_DIR / "profile.json").read_text())["quick_refit"]["from_profile"]
    assert not (
        tmp_path / REFIT_DIR / "calibration.md"
    ).exists()  # the stored profile's record is not the refit's
    assert json.loads((tmp_path / RECORD_FILE).read_text())["verdict"] == "accepted"
    report = (tmp_path / REPORT_FILE).read_text()
    assert "| local batch | measured step (ms) |" in report and "accepted" in report


def test_a_machine_with_a_cache_cliff_is_refused_naming_the_drift_and_the_override(tmp_path):
    stored = _with_compute(load_profile(PROFILE), _line())
    now = _with_compute(stored, _line(knee_batch=192.0, knee_beta_s=6e-4))  # a cliff the stored profile lacks
    with pytest.raises(ProfileDriftError) as e:
        quick_calibrate(SimulatedRanks(now), stored, FAST, tmp_path, seed=0, interval=K)
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["verdict"] == "refused" and record["drift"]["worst_batch"] == 320
    assert record["refit"]["after"]["knee_batch"] == pytest.approx(192.0, abs=16)  # the knee is refitted
    drift = record["drift"]["max_drift"]
    assert drift > 0.10
    message = str(e.value)
    assert f"{-drift:+.1%} off this machine's now at local batch 320" in message
    assert "calibrate.max_drift=0.1 (10%)" in message and "calibrate.refuse=false" in message
    assert f"{REFIT_DIR}" in message
    # the override it names lets the deploy through
    allowed = replace(FAST, max_drift=float(message.split("set calibrate.max_drift=")[1].split()[0]))
    assert (
        quick_calibrate(SimulatedRanks(now), stored, allowed, tmp_path, seed=0, interval=K)["verdict"]
        == "accepted"
    )
    relaxed = replace(FAST, refuse=False)
    assert quick_calibrate(SimulatedRanks(now), stored, relaxed, tmp_path, seed=0, interval=K)[
        "verdict"
    ].startswith("over")


def test_an_all_reduce_slower_than_stored_is_refitted_and_the_drift_read_against_the_measured(tmp_path):
    stored = load_profile(PROFILE)
    comm = stored.comm[KEY]
    now = replace(stored, comm={KEY: replace(comm, alpha_intra_s=comm.alpha_intra_s + 0.02)})  # 20 ms more
    record = quick_calibrate(
        SimulatedRanks(now), stored, replace(FAST, refuse=False), tmp_path, seed=0, interval=K
    )
    rows = record["drift"]["rows"]
    assert all(r["stored_s"] < r["measured_s"] for r in rows)  # the stored all-reduce is too fast
    assert record["drift"]["max_drift"] == pytest.approx(
        max(abs(r["stored_s"] / r["measured_s"] - 1) for r in rows)
    )
    assert record["drift"]["max_drift"] > 0.10 and record["verdict"].startswith("over")
    fit = record["comm_refit"]["fit"]
    assert not fit["kept_stored"] and fit["mape_after"] < 0.02 < fit["mape_before"]
    refit = load_profile(tmp_path / REFIT_DIR).comm[KEY]
    assert refit.alpha_intra_s > comm.alpha_intra_s + 0.01  # most of the 20 ms found (gamma trades a little)
    assert (refit.beta_intra_s, refit.alpha_inter_s, refit.beta_inter_s) == (
        comm.beta_intra_s, comm.alpha_inter_s, comm.beta_inter_s,
    )  # fmt: skip
    assert record["drift"]["refit_max_error"] < 0.03
    report = (tmp_path / REPORT_FILE).read_text()
    assert "refitted all-reduce (one node): latency" in report and "| refit error |" in report


def test_the_overheads_are_measured_on_the_ranks_and_written_into_the_refit(tmp_path):
    stored = load_profile(PROFILE)
    now = replace(stored, simulator={**stored.simulator, "interval_overhead_s": 0.5, "reconfig_delay_s": 0.2})
    assert stored.simulator["interval_overhead_s"] < 0.3  # the stored pair is another machine's
    record = quick_calibrate(SimulatedRanks(now), stored, FAST, tmp_path, seed=0, interval=K)
    rec = record["overheads"]
    assert rec["kept"] == "measured" and rec["interval"] == K and not rec["episode_ended"]
    assert rec["stored"]["interval_overhead_s"] == stored.simulator["interval_overhead_s"]
    assert len(rec["samples"]) == FAST.overhead_intervals - 1  # the first interval has no start to read from
    assert sorted({c for c, _ in rec["samples"]}) == [False, True]  # held and changed batches both seen
    assert rec["measured"]["interval_overhead_s"] == pytest.approx(0.5, abs=1e-9)
    assert rec["measured"]["reconfig_delay_s"] == pytest.approx(0.2, abs=1e-9)
    refit = load_profile(tmp_path / REFIT_DIR).simulator
    assert refit["interval_overhead_s"] == rec["measured"]["interval_overhead_s"]
    assert refit["reconfig_delay_s"] == rec["measured"]["reconfig_delay_s"]
    assert refit["min_batch"] == stored.simulator["min_batch"]  # the rest as stored
    report = (tmp_path / REPORT_FILE).read_text()
    assert (
        f"per-interval overheads, measured over {FAST.overhead_intervals - 1} interval(s) of K={K}" in report
    )
    assert "-> 500.0 ms, reconfiguration" in report and "-> 200.0 ms" in report


def test_no_overhead_intervals_keep_the_stored_pair(tmp_path):
    stored = load_profile(PROFILE)
    now = replace(stored, simulator={**stored.simulator, "interval_overhead_s": 0.5})
    record = quick_calibrate(
        SimulatedRanks(now), stored, replace(FAST, overhead_intervals=0), tmp_path, seed=0, interval=K
    )
    assert record["overheads"]["kept"] == "stored" and record["overheads"]["measured"] is None
    assert load_profile(tmp_path / REFIT_DIR).simulator == stored.simulator
    assert "the stored profile's kept" in (tmp_path / REPORT_FILE).read_text()


def test_an_episode_that_ends_stops_the_overhead_measurement():
    from dynamix_gym.measurement.profiling import measure_overheads

    reports = iter(
        [SimpleNamespace(wall_time_s=w, iteration_time_s=np.array([0.01]), alive=np.array([True]), iterations=10)
         for w in (1.0, 1.4, 1.8)]
    )  # fmt: skip
    calls = []

    def step(b):
        calls.append(int(b[0]))
        return next(reports, None)

    out = measure_overheads(step, [np.array([32])] * 6, progress=False)
    assert calls == [32, 32, 32, 32]  # the fourth step said the episode was over: no fifth
    assert out.interval_overhead_s == pytest.approx(0.3) and len(out.samples) == 2


def test_refit_comm_intra_recovers_a_known_all_reduce_and_names_bad_input():
    from sim.fitting.comm import refit_comm_intra
    from sim.network import CommParams

    compute = _line()
    truth = CommParams("cpu", "mnist_cnn", 0.03, 1e-3, 0.05, 2e-3, 2.0)
    b = np.array([8, 16, 32, 64, 128, 256], dtype=float)
    step = step_time_s(compute, truth, b, replicas=4)
    wrong = replace(truth, alpha_intra_s=0.002, gamma=1.0)
    params, fit = refit_comm_intra(b, step, 4, compute, wrong)
    assert params.alpha_intra_s == pytest.approx(0.03, rel=1e-3) and params.gamma == pytest.approx(
        2.0, rel=1e-3
    )
    assert params.beta_intra_s == 1e-3 and params.alpha_inter_s == 0.05 and not fit["kept_stored"]
    assert fit["mape_after"] < 1e-6 < fit["mape_before"] and params.fit_mape == fit["mape_after"]
    assert refit_comm_intra(b, step, 4, compute, truth)[0] == truth  # already right: kept as it is
    with pytest.raises(ValueError, match=r"replicas must be an integer >= 2"):
        refit_comm_intra(b, step, 1, compute, truth)
    with pytest.raises(
        ValueError, match=r">= 2 \(local batch, step time\) pairs of equal length, got 6 batches and 5"
    ):
        refit_comm_intra(b, step[:5], 4, compute, truth)
    with pytest.raises(ValueError, match=r"step times must be finite and > 0 s"):
        refit_comm_intra(b, np.where(b == 8, -1.0, step), 4, compute, truth)


def test_measured_drift_reads_the_model_against_the_measured_step_times():
    d = measured_drift((_line(), None), [64, 16], [2e-3 + 3e-4 * 64, 1.25 * (2e-3 + 3e-4 * 16)], replicas=1)
    assert [r["local_batch"] for r in d["rows"]] == [16, 64]
    assert d["rows"][1]["drift"] == pytest.approx(0.0, abs=1e-12)
    assert d["worst_batch"] == 16 and d["max_drift"] == pytest.approx(0.2, abs=1e-12)  # 1 / 1.25 - 1
    with pytest.raises(ValueError, match=r"as many measured step times as local batches"):
        measured_drift((_line(), None), [16, 64], [0.01], replicas=1)
    with pytest.raises(ValueError, match=r"measured step time at local batch 16 must be finite and > 0 s"):
        measured_drift((_line(), None), [16], [0.0], replicas=1)


def test_the_ladder_runs_without_checkpoints_or_guards_and_gives_both_back(tmp_path):
    from sim.guards import Guard

    class Watched(SimulatedRanks):
        seen: set = set()

        def run_interval(self, local_batches, iterations):
            self.seen.add((self.guard.config.mode, self.config.checkpoint_every))
            return super().run_interval(local_batches, iterations)

    stored = load_profile(PROFILE)
    ranks = Watched(stored)
    ranks.config = RealDDPConfig(workers=2, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
    ranks.guard = guard = Guard("act")
    quick_calibrate(ranks, stored, FAST, tmp_path, seed=0, interval=K)
    assert ranks.seen == {("off", 0)}
    assert ranks.guard is guard and ranks.config.checkpoint_every == 2


def test_a_cap_too_short_for_three_batches_is_named(tmp_path, monkeypatch):
    import dynamix_gym.measurement.profiling as profiling

    stored = load_profile(PROFILE)
    real = profiling.profile_ladder

    def two_points(*args, **kwargs):
        out = real(*args, **kwargs)
        out.points = out.points[:2]
        return out

    monkeypatch.setattr(profiling, "profile_ladder", two_points)
    with pytest.raises(
        ValueError, match=r"measured 2 local batch\(es\) within calibrate.max_s=60 s .*raise calibrate.max_s"
    ):
        quick_calibrate(SimulatedRanks(stored), stored, FAST, tmp_path, seed=0, interval=K)


# --- settings and preconditions ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_drift": 0}, r"calibrate.max_drift must lie in \(0, 10\] \(a fraction: 0.10 is 10%\), got 0"),
        ({"max_drift": float("nan")}, r"calibrate.max_drift must lie in \(0, 10\]"),
        ({"max_s": 0}, r"calibrate.max_s must lie in \(0, 600\] seconds, got 0"),
        ({"max_s": 3600}, r"calibrate.max_s must lie in \(0, 600\] seconds, got 3600"),
        ({"iterations": 0}, r"calibrate.iterations must be an integer in \[1, 1000\], got 0"),
        ({"batches": [16, 32]}, r"calibrate.batches must list at least 3 distinct local batches"),
        ({"quick": "yes"}, "calibrate.quick must be true or false, got 'yes'"),
        (
            {"overhead_batches": [32]},
            r"calibrate.overhead_batches must list at least 2 distinct local batches",
        ),
        (
            {"overhead_intervals": -1},
            r"calibrate.overhead_intervals must be an integer in \[0, 200\], got -1",
        ),
        ({"overhead_max_s": 0}, r"calibrate.overhead_max_s must lie in \(0, 600\] seconds, got 0"),
        ({"max_drif": 0.2}, r"calibrate.max_drif is not a setting; calibrate takes \['quick', 'profile'"),
    ],
)
def test_bad_settings_name_the_field_and_range(values, message):
    with pytest.raises(ValueError, match=message):
        QuickCalibration.from_config(values)


def test_the_stored_profile_is_the_given_one_else_the_bundles_training_profile():
    from dynamix_gym.controllers.bundle import PPOController
    from dynamix_gym.controllers.registry import make_controller

    given = stored_profile(QuickCalibration(quick=True, profile=str(PROFILE)), None)
    assert given.path == PROFILE
    bundle = PPOController(
        path=ROOT / "results" / "fidelity" / "policy"
    )  # trained on results/fidelity/profile
    assert stored_profile(QuickCalibration(quick=True), bundle).path.resolve() == PROFILE.resolve()
    with pytest.raises(ValueError, match=r"give calibrate.profile=<profile dir>"):
        stored_profile(QuickCalibration(quick=True), make_controller("dlb"))
    with pytest.raises(ValueError, match=r"calibrate.profile: cluster profile 'nowhere' not found"):
        stored_profile(QuickCalibration(quick=True, profile="nowhere"), None)


def test_emulated_ranks_and_foreign_profiles_are_refused_naming_the_setting():
    stored = load_profile(PROFILE)
    ranks = SimulatedRanks(stored)
    ranks.config = RealDDPConfig(workers=2, emulate=("T4", "V100"))
    with pytest.raises(
        ValueError, match=r"emulate \['T4', 'V100'\] \(backend.emulate=cluster\): set backend.emulate=null"
    ):
        check_ranks(ranks, stored)
    gpu_ranks = SimpleNamespace(
        spec=SimpleNamespace(gpu_types=("cuda", "cuda")), config=RealDDPConfig(workers=2)
    )
    with pytest.raises(
        ValueError, match=r"has no compute model of \(cuda, mnist_cnn\) \(it has \[\('cpu', 'mnist_cnn'\)\]\)"
    ):
        check_ranks(gpu_ranks, stored)
    assert check_ranks(SimulatedRanks(stored), stored) == KEY


def test_refit_compute_knee_replaces_the_one_model_in_place(tmp_path):
    shutil.copytree(PROFILE, tmp_path / "p")
    b = np.array([16, 32, 64, 128, 192, 256, 320], dtype=float)
    t = 2e-3 + 3e-4 * b + 6e-4 * np.maximum(0.0, b - 192)
    out = refit_compute_knee(tmp_path / "p", b, t, "test")
    assert out["before"]["exponent"] != 1.0 and out["after"]["knee_batch"] == pytest.approx(192.0, abs=16)
    params = load_profile(tmp_path / "p").compute[KEY]
    assert params.knee_batch == out["after"]["knee_batch"] and params.max_batch == 512
    with pytest.raises(ValueError, match=r"0 compute models match \(gpu=V100, app=None\)"):
        refit_compute_knee(tmp_path / "p", b, t, "test", gpu="V100")


# --- real ranks -------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_short_ladder_on_two_cpu_ranks_refits_and_checks_the_stored_profile(tmp_path):
    """The profile's own real setup (2 gloo ranks, CNN on MNIST); a tolerance no machine meets, so the
    refusal path runs whatever this shared machine's load, and its record says what was measured."""
    from adapters.ddp_backend import DDPBackend

    stored = load_profile(PROFILE)
    real = {k: v for k, v in stored.meta["provenance"]["real_config"].items() if k != "noise_smoothing"}
    backend = DDPBackend(RealDDPConfig(**{**real, "target_accuracy": 1.0}))
    settings = QuickCalibration(
        quick=True, max_s=60.0, batches=(16, 32, 64, 128), iterations=5, repeats=2, warmup_iterations=2,
        max_drift=1e-6, progress=False,
    )  # fmt: skip
    try:
        with pytest.raises(ProfileDriftError, match=r"calibrate.max_drift=1e-06"):
            quick_calibrate(backend, stored, settings, tmp_path, seed=0, interval=K)
        backend.reset(seed=1)  # the ranks train on afterwards, from a fresh start
        report = backend.run_interval(np.array([32, 32]), 5)
    finally:
        backend.close()
    assert report.iterations == 5
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["verdict"] == "refused" and record["ladder"]["elapsed_s"] <= 60.0 + 15.0
    assert [m["local_batch"] for m in record["measured"]] == [16, 32, 64, 128]
    steps = [m["step_time_s"] for m in record["measured"]]
    assert all(s > 0 for s in steps) and steps[-1] > steps[0]  # a larger batch takes longer
    assert load_profile(tmp_path / REFIT_DIR).compute[KEY].exponent == 1.0


@pytest.mark.integration
@pytest.mark.slow  # the deploy app: a ladder and an episode on 2 real ranks (about a minute here)
def test_deploy_calibrates_fine_tunes_and_runs_when_told_to_despite_drift(tmp_path):
    out = tmp_path / "run"
    proc = run_python([
        "-m", "experiments.deploy", "policy=results/fidelity/policy", "backend.emulate=null", "backend.workers=2",
        "calibrate.quick=true", "calibrate.batches=[16,32,64,128]", "calibrate.iterations=5", "calibrate.max_s=40",
        "calibrate.max_drift=1e-6", "calibrate.refuse=false", "calibrate.progress=false", "env.max_decisions=2",
        "finetune=true", "finetuning.timesteps=1024", "finetuning.seeds=[2000,2001]", "finetuning.progress=false",
        f"out_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}",
    ], timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(calibrate.refuse=false: deploying anyway)" in proc.stdout + proc.stderr
    record = json.loads((out / RECORD_FILE).read_text())
    assert (
        record["verdict"] == "over tolerance, deployed anyway"
        and record["stored_profile"] == "results/fidelity/profile"
    )
    assert (out / "summary.csv").exists() and load_profile(out / REFIT_DIR).compute[KEY].exponent == 1.0
    finetuned = json.loads((out / "finetune.json").read_text())  # fine-tuned on the refit, then judged
    assert finetuned["profile"].endswith(REFIT_DIR) and len(finetuned["tta_s"]["finetuned"]) == 2


def test_the_calibration_hands_the_ranks_the_compute_curve_it_measured(tmp_path):
    """What observation schema 4 reads on real ranks: the refit's compute model of the ranks, set on the
    backend's spec right after the ladder (DDPBackend.use_compute_profile), so the run encodes with it."""
    from adapters.ddp_backend import DDPBackend
    from sim.profile import profile_compute_curve

    class Ranks(SimulatedRanks):
        use_compute_profile = DDPBackend.use_compute_profile

    stored = load_profile(PROFILE)
    ranks = Ranks(_with_compute(stored, _line(alpha_s=4e-3, beta_s=6e-4)))  # twice the stored speed's cost
    before = ranks.spec
    quick_calibrate(ranks, stored, replace(FAST, refuse=False), tmp_path, seed=0, interval=K)
    assert ranks.spec is not before and ranks.config.compute_profile == str(tmp_path / REFIT_DIR)
    refit = load_profile(tmp_path / REFIT_DIR)
    expected = profile_compute_curve(refit, before.gpu_types, before.min_batch, before.max_batch)
    np.testing.assert_allclose(ranks.spec.compute_curve_s, expected)
    # the measured curve, not the stored one: the refit follows the ranks' own (slower) steps
    stored_curve = profile_compute_curve(stored, before.gpu_types, before.min_batch, before.max_batch)
    assert np.all(ranks.spec.compute_curve_s[:, -1] > 1.5 * stored_curve[:, -1])


def test_deploy_refuses_a_schema4_bundle_it_cannot_give_a_curve_before_any_rank_starts(tmp_path):
    from sb3_contrib import MaskablePPO

    from dynamix_gym import HeteroClusterEnv
    from dynamix_gym.controllers.bundle import BundleMeta, PPOController, save_bundle
    from dynamix_gym.envs.vec_env import PerWorkerVecEnv
    from experiments.deploy import check_compute_curve

    steps = [0.5, 1.0, 2.0]
    make = lambda: HeteroClusterEnv(workers=2, obs_schema=4, action_mode="scale", action_set=steps)  # noqa: E731
    model = MaskablePPO("MlpPolicy", PerWorkerVecEnv([make]), n_steps=8, batch_size=8, seed=0, device="cpu")
    meta = BundleMeta(obs_form="per_worker", action_set=steps, action_mode="scale", algorithm="maskable_ppo",
                      schema_version="4")  # fmt: skip
    ctl = PPOController(save_bundle(tmp_path / "b4", model, meta, None))
    with pytest.raises(
        ValueError, match=r"schema 4 reads BackendSpec\.compute_curve_s.*set calibrate\.quick=true"
    ):
        check_compute_curve(ctl, False, {})
    with pytest.raises(
        ValueError, match=r"a resumed run is not calibrated again: give backend\.compute_profile"
    ):
        check_compute_curve(ctl, True, {"resume": True})
    check_compute_curve(ctl, True, {})  # calibrated right before
    check_compute_curve(ctl, False, {"compute_profile": str(PROFILE)})  # or given
    check_compute_curve(PPOController(UNIVERSAL_BUNDLE), False, {})  # schema 3 reads no curve
