"""Pipeline schedules: hand-computed makespans, the bubble formula, the critical path."""

from __future__ import annotations

import numpy as np
import pytest

from sim.pipeline.schedule import bubble_fraction, in_flight, iteration_time_s, stage_ops, steady_period_s


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_two_stages_two_micro_batches_by_hand(kind):
    # f = (1, 2), b = (2, 3). GPipe: s0 F0 [0,1] F1 [1,2]; s1 F0 [1,3] F1 [3,5] B0 [5,8] B1 [8,11];
    # s0 B0 [8,10] B1 [11,13]. 1F1B: s1 F0 [1,3] B0 [3,6]; s0 F1 [1,2] B0 [6,8]; s1 F1 [6,8]
    # B1 [8,11]; s0 B1 [11,13].
    makespan, counts = iteration_time_s(kind, [1.0, 2.0], [2.0, 3.0], 2)
    assert makespan == pytest.approx(13.0)
    assert (counts[:, 0] * [1, 2] + counts[:, 1] * [2, 3]).sum() == pytest.approx(13.0)


def test_three_stages_1f1b_by_hand():
    # S = 3, M = 2, every f = 1, b = 1 except stage 1's backward b1 = 4.
    # s0: F0 [0,1] F1 [1,2]; s1: F0 [1,2] F1 [2,3]... 1F1B on s1 (w = 1): F0 [1,2], F1 [2,3], B0, B1.
    # s2 (w = 0): F0 [2,3] B0 [3,4] F1 [4,5] B1 [5,6]. s1: B0 after max(3, 4) -> [4,8]; B1 after
    # max(8, 6) -> [8,12]. s0 (w = 2): B0 after 8 -> [8,9]; B1 after 12 -> [12,13].
    makespan, _ = iteration_time_s("1f1b", [1.0, 1.0, 1.0], [1.0, 4.0, 1.0], 2)
    assert makespan == pytest.approx(13.0)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("micro", [1, 2, 7, 16])
def test_uniform_stages_bubble_formula(kind, stages, micro):
    f, b = 0.3, 0.7
    makespan, _ = iteration_time_s(kind, [f] * stages, [b] * stages, micro)
    assert makespan == pytest.approx((micro + stages - 1) * (f + b))
    bubble = bubble_fraction(makespan, np.full(stages, f), np.full(stages, b), micro)
    np.testing.assert_allclose(bubble, (stages - 1) / (micro + stages - 1), atol=1e-12)


def test_gpipe_closed_form_on_random_stages():
    rng = np.random.default_rng(3)
    for _ in range(200):
        S, M = int(rng.integers(1, 7)), int(rng.integers(1, 10))
        f, b = rng.uniform(0.1, 2, S), rng.uniform(0.1, 4, S)
        makespan, counts = iteration_time_s("gpipe", f, b, M)
        assert makespan == pytest.approx(f.sum() + (M - 1) * f.max() + b.sum() + (M - 1) * b.max())
        assert makespan == pytest.approx((counts[:, 0] * f + counts[:, 1] * b).sum())


def test_slow_stage_is_the_bottleneck():
    f, b = np.full(4, 1.0), np.full(4, 2.0)
    base, _ = iteration_time_s("1f1b", f, b, 16)
    f[2], b[2] = 2.0, 4.0  # stage 2 at half speed
    slow, counts = iteration_time_s("1f1b", f, b, 16)
    assert slow > base + 15 * 3.0 - 1e-9  # each extra micro-batch waits on stage 2
    assert counts[2].sum() == counts.sum(axis=1).max()  # the path lingers on stage 2
    assert steady_period_s(f, b) == pytest.approx(6.0)


def test_1f1b_order_and_in_flight():
    ops = stage_ops("1f1b", 3, 4)
    assert ops[0][:3] == [("F", 0), ("F", 1), ("F", 2)]
    assert ops[2][:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert [in_flight("1f1b", s, 3, 4) for s in range(3)] == [3, 2, 1]
    assert in_flight("gpipe", 2, 3, 4) == 4
    with pytest.raises(ValueError, match="schedule"):
        stage_ops("zero_bubble", 3, 4)
    with pytest.raises(ValueError, match="micro_batches"):
        stage_ops("1f1b", 3, 0)
