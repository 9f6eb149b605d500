"""The batched engine against the SimPy engine: same seeds, same fault timelines, same reports.

Every scenario preset on the benchmark's cluster shapes (``conf/bench_sim.yaml``: 4, 8, 16 and 64
workers), one batch holding them all (mixed sizes and scenarios), under three controllers: batches
held, batches redrawn every interval (a reconfiguration each time) and batches re-split by the
throughput each report measured (a feedback loop: a difference would grow). A mutation of the
batched engine's constants must fail the comparison.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest

from sim import batched as batched_mod
from sim import batched_noise
from sim.batched import BatchedSimulator
from sim.cluster import default_cluster
from sim.engine import Simulator
from sim.fault_timeline import FaultTimeline
from sim.faults import SCENARIOS
from sim.protocol import IntervalReport

SHAPES = (4, 8, 16, 64)
K = 50
RTOL = 1e-9


def _worlds(scenarios=tuple(SCENARIOS), shapes=SHAPES, workload="cifar10"):
    return [(sc, n, workload) for sc in scenarios for n in shapes]


def _pair(worlds, noise="stream", seed0=100):
    refs, descs = [], []
    for sc, n, wl in worlds:
        refs.append(Simulator(default_cluster(n), wl, sc))
        descs.append(Simulator(default_cluster(n), wl, sc))
    batch = BatchedSimulator(descs, noise=noise, seed=0)
    for i, ref in enumerate(refs):
        ref.reset(seed=seed0 + i)
        batch.reset(i, np.random.default_rng(seed0 + i))
    return refs, batch


def _controller(name: str, ref: Simulator, last: IntervalReport | None, rng: np.random.Generator):
    lo, hi = ref.min_batch, ref.max_batch
    if name == "hold" or last is None:
        return np.clip(np.full(ref.num_workers, 128), lo, hi)
    if name == "random":
        return rng.integers(lo, hi + 1)
    # re-split the global batch in proportion to measured compute throughput (dead workers keep theirs)
    alive = last.alive & (last.compute_time_s > 0)
    b = last.local_batch.astype(np.float64)
    speed = np.where(alive, b / np.where(alive, last.compute_time_s, 1.0), 0.0)
    total = b[alive].sum()
    share = np.where(alive, np.rint(total * speed / max(speed.sum(), 1e-12)), b)
    return np.clip(share, lo, hi).astype(np.int64)


def mismatches(ref: IntervalReport, got: IntervalReport) -> list[str]:
    """Fields of ``got`` that differ from ``ref`` beyond floating-point rounding (events exactly)."""
    out = []
    for f in fields(IntervalReport):
        a, b = getattr(ref, f.name), getattr(got, f.name)
        if f.name == "events":
            if tuple(a) != tuple(b):
                out.append(f"events {a} != {b}")
            continue
        pairs = [(f.name, a, b)] if f.name != "truth" else [(f"truth.{k}", a[k], b[k]) for k in a]
        for name, x, y in pairs:
            x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            if x.shape != y.shape:
                out.append(f"{name}: shape {x.shape} != {y.shape}")
                continue
            atol = 1e-12 * max(float(np.max(np.abs(x), initial=0.0)), 1e-300)
            if name == "idle_time_s":  # a sum difference: rounding of the iteration time's order
                atol = 1e-12 * float(np.max(ref.iteration_time_s, initial=0.0))
            if not np.allclose(y, x, rtol=RTOL, atol=atol, equal_nan=True):
                out.append(f"{name}: {x.tolist()} != {y.tolist()}")
    return out


def run_both(worlds, controller: str, intervals: int, noise="stream"):
    """Step both engines through ``intervals`` intervals; the mismatches found, the references."""
    refs, batch = _pair(worlds, noise=noise)
    rng = np.random.default_rng(7)
    last: list[IntervalReport | None] = [None] * len(refs)
    found = []
    for step in range(intervals):
        chosen = [_controller(controller, ref, last[i], rng) for i, ref in enumerate(refs)]
        b = np.ones((len(refs), batch.width), dtype=np.int64)
        for i, c in enumerate(chosen):
            b[i, : len(c)] = c
        got = batch.run_interval(b, K)
        for i, ref in enumerate(refs):
            expected = ref.run_interval(chosen[i], K)
            bad = mismatches(expected, batch.report(got, i))
            if bad:
                found.append((step, worlds[i], bad[:3]))
            last[i] = expected
    return found, refs, batch


def _check(worlds, controller, intervals):
    found, refs, batch = run_both(worlds, controller, intervals=intervals)
    assert not found, found[:3]
    # identical fault timelines: the whole log, event for event (time, kind, target, value)
    for i, ref in enumerate(refs):
        assert _log(batch, i) == ref.fault_log
    # the comparison is not vacuous: faults of every kind happened, workers were lost and rejoined
    kinds = {e.kind for ref in refs for e in ref.fault_log}
    assert kinds >= {"throttle", "interference", "congestion", "loss"}, kinds
    return refs


def _log(batch, i):
    tl = batch.timelines[i]
    return tl.log(0, tl.log_end(int(batch.cursor[i]) - 1))


@pytest.mark.parametrize("controller", ["hold", "random", "balance"])
def test_batched_engine_reproduces_the_simpy_engine(controller):
    """Every preset at 8 workers and ``mixed`` at every benchmark shape, in one batch."""
    worlds = _worlds(shapes=(8,)) + _worlds(("mixed",), (4, 16, 64))
    _check(worlds, controller, intervals=100)


@pytest.mark.slow
@pytest.mark.parametrize("controller", ["hold", "random", "balance"])
def test_batched_engine_reproduces_the_simpy_engine_on_the_full_grid(controller):
    """Every preset on every benchmark shape (36 worlds in one batch), runs past 10 minutes."""
    refs = _check(_worlds(), controller, intervals=150)
    assert min(ref.now_s for ref in refs) > 600.0


@pytest.mark.parametrize("workload", ["imagenet", "ncf"])
def test_other_workloads_and_lr_rules_match(workload):
    worlds = _worlds(("mixed", "loss_rejoin"), (8,), workload)
    refs, batch = _pair(worlds)
    # a third world with another learning-rate rule, in the same batch
    extra = Simulator(default_cluster(4), workload, "throttle", lr_rule="sqrt")
    ref_extra = Simulator(default_cluster(4), workload, "throttle", lr_rule="sqrt")
    batch = BatchedSimulator(
        [*(Simulator(default_cluster(8), workload, s) for s, _, _ in worlds), extra], noise="stream"
    )
    for i, ref in enumerate([*refs, ref_extra]):
        ref.reset(seed=5 + i)
        batch.reset(i, np.random.default_rng(5 + i))
    refs = [*refs, ref_extra]
    for _ in range(40):
        b = np.ones((len(refs), batch.width), dtype=np.int64)
        chosen = [np.clip(np.full(r.num_workers, 64), r.min_batch, r.max_batch) for r in refs]
        for i, c in enumerate(chosen):
            b[i, : len(c)] = c
        got = batch.run_interval(b, 20)
        for i, ref in enumerate(refs):
            assert not mismatches(ref.run_interval(chosen[i], 20), batch.report(got, i))


def test_a_calibrated_profile_world_matches():
    """A profile's fitted models, host-side compute, interval overhead (the fidelity profile)."""
    ref = Simulator(profile="results/fidelity/profile", scenario="mixed")
    batch = BatchedSimulator(
        [Simulator(profile="results/fidelity/profile", scenario="mixed")], noise="stream"
    )
    assert ref.compute_on_host and ref.interval_overhead_s > 0
    ref.reset(seed=1)
    batch.reset(0, np.random.default_rng(1))
    rng = np.random.default_rng(0)
    for _ in range(40):
        b = rng.integers(ref.min_batch, ref.max_batch + 1)
        assert not mismatches(ref.run_interval(b, 20), batch.report(batch.run_interval(b[None], 20), 0))


MUTATIONS = {
    "gradient noise scale": lambda mp: mp.setattr(batched_noise, "GRAD_GAMMA", (25.0, 0.0401)),
    "TCP segment size": lambda mp: mp.setattr(batched_mod, "TCP_MSS_BYTES", 1500),
    "fault times": lambda mp: mp.setattr(FaultTimeline, "time", _late_time),
}
_ORIGINAL_TIME = FaultTimeline.time


def _late_time(self, i):
    t = _ORIGINAL_TIME(self, i)
    return t if math.isinf(t) or t == 0.0 else t + 0.5


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_changed_constant_fails_the_comparison(mutation, monkeypatch):
    MUTATIONS[mutation](monkeypatch)
    found, _, _ = run_both(_worlds(("jitter", "mixed"), (16,)), "hold", intervals=80)
    assert found, f"the comparison did not notice the mutation {mutation!r}"


def test_drawing_the_timeline_in_other_chunks_changes_nothing(monkeypatch):
    import sim.fault_timeline as ft

    worlds = _worlds(("short_throttles",), (8,))
    _, a = run_both(worlds, "hold", intervals=30)[1:]
    monkeypatch.setattr(ft, "_CHUNK_EVENTS", 1)
    found, _, b = run_both(worlds, "hold", intervals=30)
    assert not found
    assert _log(a, 0) == _log(b, 0)
    assert len(_log(a, 0)) > 10


def _batch_reports(worlds, intervals):
    _, batch = _pair(worlds, noise="batch")
    rng = np.random.default_rng(3)
    out = []
    for _ in range(intervals):
        b = np.ones((len(worlds), batch.width), dtype=np.int64)
        for i, w in enumerate(batch.world.sims):
            b[i, : w.num_workers] = rng.integers(w.min_batch, w.max_batch + 1)
        out.append(batch.run_interval(b, K))
    return out


def test_working_the_batch_in_other_chunks_changes_nothing(monkeypatch):
    """One cluster per chunk: still the SimPy engine's reports (own streams), and with the batch's
    stream the very same numbers as in whole-batch chunks (the draws are consumed in one order)."""
    worlds = _worlds(("mixed", "loss_rejoin", "short_throttles"), (4, 16))
    whole = _batch_reports(worlds, 25)
    assert batched_noise.chunk_rows(16, K) >= len(worlds)  # the default: the batch is one chunk
    monkeypatch.setattr(batched_noise, "CHUNK_ELEMENTS", 1)
    assert batched_noise.chunk_rows(16, K) == 1
    found, _, _ = run_both(worlds, "random", intervals=40)
    assert not found, found[:3]
    for a, b in zip(whole, _batch_reports(worlds, 25), strict=True):
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "truth":
                assert all(np.array_equal(x[k], y[k]) for k in x)
            else:
                assert np.array_equal(x, y), f.name


def test_batch_noise_keeps_the_fault_timelines_and_the_noise_law():
    worlds = [("static_hetero", 8, "cifar10")] * 96 + [("mixed", 8, "cifar10")] * 8
    refs, batch = _pair(worlds, noise="batch")
    b = np.full((len(worlds), 8), 128)
    got_it, ref_it, got_g, ref_g = [], [], [], []
    for _ in range(20):
        got = batch.run_interval(b, K)
        for i, ref in enumerate(refs):
            r = ref.run_interval(b[i], K)
            if i < 96:
                ref_it.append(r.iteration_time_s / r.iteration_time_s.mean())
                got_it.append(got.iteration_time_s[i] / got.iteration_time_s[i].mean())
                ref_g.append(r.grad_norm_var / r.grad_norm_mean**2)
                got_g.append(got.grad_norm_var[i] / got.grad_norm_mean[i] ** 2)
    for i, ref in enumerate(refs):  # faults do not draw from the noise: the same timelines
        assert _log(batch, i) == ref.fault_log
    # the spread of measurement noise and of gradient norms: same law (standard errors ~1%)
    for ours, theirs in ((got_it, ref_it), (got_g, ref_g)):
        a, c = np.std(np.concatenate(ours)), np.std(np.concatenate(theirs))
        assert abs(a / c - 1) < 0.08, (a, c)
    assert np.mean(np.concatenate(got_g)) == pytest.approx(np.mean(np.concatenate(ref_g)), rel=0.05)


def test_bad_input_names_the_field():
    _, batch = _pair([("static_hetero", 4, "cifar10")])
    with pytest.raises(ValueError, match=r"local_batches must have shape \(1, 4\)"):
        batch.run_interval(np.full((1, 3), 64), K)
    with pytest.raises(
        ValueError, match=r"local_batches\[0\]\[2\] = 100000 is outside worker 2's allowed range"
    ):
        batch.run_interval(np.array([[64, 64, 100000, 64]]), K)
    with pytest.raises(ValueError, match="whole numbers"):
        batch.run_interval(np.array([[64.5, 64, 64, 64]]), K)
    with pytest.raises(ValueError, match="noise"):
        BatchedSimulator([Simulator()], noise="fast")
    fresh = BatchedSimulator([Simulator()])
    with pytest.raises(RuntimeError, match="reset"):
        fresh.run_interval(np.full((1, 8), 64), K)


def test_a_split_noise_world_matches(tmp_path):
    """A convergence model whose progress noise is split from the reported one (two counters)."""
    import json
    import shutil

    prof = tmp_path / "split"
    shutil.copytree("results/fidelity/profile", prof)
    doc = json.loads((prof / "convergence_models.json").read_text())
    for m in doc["models"]:
        m["progress_noise_factor"] = 8.0
    (prof / "convergence_models.json").write_text(json.dumps(doc))
    ref = Simulator(profile=str(prof), scenario="mixed")
    batch = BatchedSimulator([Simulator(profile=str(prof), scenario="mixed")], noise="stream")
    assert ref.convergence.split_noise
    ref.reset(seed=2)
    batch.reset(0, np.random.default_rng(2))
    rng = np.random.default_rng(1)
    for _ in range(30):
        b = rng.integers(ref.min_batch, ref.max_batch + 1)
        assert not mismatches(ref.run_interval(b, 20), batch.report(batch.run_interval(b[None], 20), 0))
    assert ref.progress > ref.noise_progress  # the two counters did part
    assert float(batch.progress[0]) == pytest.approx(ref.progress, rel=1e-9)
