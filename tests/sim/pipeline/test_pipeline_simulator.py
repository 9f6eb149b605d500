"""The pipeline simulator: faults on stages, memory caps, re-partitions, staleness, determinism."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sim.cluster import homogeneous_cluster
from sim.faults import FaultWindow, Scenario
from sim.pipeline.links import link_bandwidth_bytes_per_s
from sim.pipeline.model import Block, ModelShape, PipelineModel, generate_model, uniform_model
from sim.pipeline.partition import PipelineMemoryError, check_sizes, even_split
from sim.pipeline.schedule import iteration_time_s
from sim.pipeline.simulator import PipelineSimulator
from sim.pipeline.staleness import staleness_penalty

QUIET = Scenario("quiet", compute_noise_cv=0.0, measurement_noise_cv=0.0)


def sim_of(model=None, scenario=QUIET, workers=4, **kw):
    sim = PipelineSimulator(homogeneous_cluster("V100", workers), model or uniform_model(8), scenario, **kw)
    sim.reset(seed=0)
    return sim


def test_noise_free_interval_matches_the_schedule():
    sim = sim_of()
    cf, cb, xf, xb, ar = sim.stage_times((2, 2, 2, 2), 8)
    assert np.all(ar == 0) and xf[-1] == 0 and xb[0] == 0 and np.all(xf[:-1] > 0)
    expect = iteration_time_s("1f1b", cf + xf, cb + xb, 8)[0]
    r = sim.run_interval((2, 2, 2, 2), 8, 5)
    assert r.iteration_time_s == pytest.approx(expect)
    assert r.interval_time_s == pytest.approx(5 * expect)
    assert r.wall_time_s == pytest.approx(5 * expect)


def test_block_time_follows_flops_and_the_fitted_speed():
    m = uniform_model(4, fwd_gflops=1.0)
    f1, b1 = m.stage_compute_s("V100", 0, 1, 8)
    f2, _ = m.stage_compute_s("V100", 0, 2, 8)
    assert f2 == pytest.approx(2 * f1) and b1 == pytest.approx(2 * f1)
    assert m.stage_compute_s("T4", 0, 1, 8)[0] > f1  # a T4 is slower than a V100 on the same block


def test_throttled_stage_becomes_the_bottleneck():
    window = FaultWindow("throttle", start_s=0.0, duration_s=1e6, worker=2, factor=0.25)
    sim = sim_of(scenario=dataclasses.replace(QUIET, windows=(window,)))
    quiet = sim_of()
    r, q = sim.run_interval((2, 2, 2, 2), 16, 3), quiet.run_interval((2, 2, 2, 2), 16, 3)
    assert r.fwd_time_s[2] == pytest.approx(4 * q.fwd_time_s[2])
    np.testing.assert_allclose(r.fwd_time_s[[0, 1, 3]], q.fwd_time_s[[0, 1, 3]])
    assert r.bubble_fraction[2] < r.bubble_fraction[[0, 1, 3]].min()  # it waits least
    assert r.iteration_time_s > 2.5 * q.iteration_time_s
    # moving blocks off the throttled stage helps
    assert sim.expected_iteration_time_s((3, 3, 1, 1), 16) < sim.expected_iteration_time_s((2, 2, 2, 2), 16)


def test_memory_cap_refused_naming_the_stage():
    sim = sim_of(memory_gib=[0.05] * 4)
    with pytest.raises(PipelineMemoryError, match=r"stage 0 .* GiB"):
        sim.run_interval((5, 1, 1, 1), 8, 1)
    sim.run_interval((2, 2, 2, 2), 8, 1)  # the even split fits
    # stage 0 of 1F1B stashes S = 4 micro-batches: fewer blocks there fit
    assert sim.stage_memory((1, 1, 1, 5), 8)[0] < sim.stage_memory((5, 1, 1, 1), 8)[0]


@pytest.mark.parametrize(
    ("sizes", "match"), [((2, 2, 2), "sum to 6"), ((0, 4, 2, 2), r"sizes\[0\]"), ((4, 4), "2 stages")]
)
def test_bad_partitions_are_refused(sizes, match):
    with pytest.raises(ValueError, match=match):
        sim_of().run_interval(sizes, 4, 1)


def test_even_split_and_sizes():
    assert even_split(10, 4) == (3, 3, 2, 2)
    with pytest.raises(ValueError, match="stages"):
        even_split(3, 4)
    assert check_sizes([1, 2], 3) == (1, 2)


def test_repartition_pays_moved_state_and_the_pause():
    sim = sim_of(repartition_pause_s=2.0)
    sim.run_interval((2, 2, 2, 2), 8, 1)
    r = sim.run_interval((3, 1, 2, 2), 8, 1)  # block 2 moves from stage 1 to stage 0
    moved = sim.model.state_bytes(2, 3)
    bw = link_bandwidth_bytes_per_s("V100", False)
    assert r.repartition_time_s == pytest.approx(2.0 + moved / bw, rel=1e-3)
    assert sim.run_interval((3, 1, 2, 2), 8, 1).repartition_time_s == 0.0


def test_lost_worker_stalls_its_stage():
    window = FaultWindow("loss", start_s=0.0, duration_s=100.0, worker=1)
    sc = dataclasses.replace(QUIET, windows=(window,))
    sim = sim_of(scenario=sc)
    r = sim.run_interval((2, 2, 2, 2), 8, 2)
    assert r.stall_time_s >= 100.0
    assert r.interval_time_s > 100.0


def test_async_1f1b_steady_state_and_staleness():
    sim = sim_of(schedule="async_1f1b")
    cf, cb, xf, xb, _ = sim.stage_times((2, 2, 2, 2), 8)
    sim.run_interval((2, 2, 2, 2), 8, 1)  # the fill
    r = sim.run_interval((2, 2, 2, 2), 8, 4)
    assert r.iteration_time_s == pytest.approx(8 * np.max(cf + xf + cb + xb))
    assert staleness_penalty(1) == 1.0
    assert staleness_penalty(2) < staleness_penalty(4) < staleness_penalty(8)
    # sum of tau^2 = (S - 1) S (2 S - 1) / 6: S^3 growth
    assert (staleness_penalty(16) - 1) / (staleness_penalty(8) - 1) == pytest.approx(
        (15 * 16 * 31) / (7 * 8 * 15)
    )


def test_more_stages_slow_async_progress_per_update():
    progress = {}
    for stages in (2, 4):
        sim = sim_of(schedule="async_1f1b", stages=stages)
        sim.run_interval(even_split(8, stages), 8, 10)
        progress[stages] = sim.progress
    assert progress[4] < progress[2]


def test_same_seed_same_reports():
    model = generate_model(np.random.default_rng(5), ModelShape(num_blocks=(16, 16)))

    def run():
        sim = PipelineSimulator(homogeneous_cluster("T4", 4), model, "interference", seed=3)
        sim.reset()
        return [sim.run_interval(even_split(16, 4), 8, 20) for _ in range(30)]

    a, b = run(), run()
    assert [x.wall_time_s for x in a] == [x.wall_time_s for x in b]
    assert [x.val_accuracy for x in a] == [x.val_accuracy for x in b]
    assert a[-1].wall_time_s != run_other_seed(model)


def run_other_seed(model):
    sim = PipelineSimulator(homogeneous_cluster("T4", 4), model, "interference", seed=4)
    sim.reset()
    return [sim.run_interval(even_split(16, 4), 8, 20) for _ in range(30)][-1].wall_time_s


def test_replicas_share_a_stage_and_all_reduce():
    sim = sim_of(workers=4, stages=2)
    cf1, _, _, _, ar = sim.stage_times((4, 4), 8)
    single = sim_of(workers=2, stages=2)
    cf2, *_ = single.stage_times((4, 4), 8)
    assert np.all(cf1 < cf2)  # each replica runs half the micro-batch
    assert np.all(ar > 0)


def test_block_validation():
    with pytest.raises(ValueError, match="fwd_gflops"):
        Block("x", 0.0, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="number of blocks"):
        PipelineModel("one", [Block("x", 1.0, 1, 1, 1, 1)])
    assert math.isfinite(link_bandwidth_bytes_per_s("T4", True))
