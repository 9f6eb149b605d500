"""The real pipeline's calibration fit (experiments.pipeline_fidelity) recovers a known twin."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.real_pipeline.twin import RealJob, digits_blocks
from experiments.pipeline_fidelity import calibration_of, fit_blocks, fit_link, mdape, predict

JOB = RealJob()


def _rows(cal: dict) -> list[dict]:
    t = cal["block_table"]
    rows = []
    for sizes, m, slow in [((1, 7), 16, (1, 1)), ((2, 6), 16, (1, 1)), ((4, 4), 16, (1, 1)),
                           ((6, 2), 8, (1, 1)), ((7, 1), 32, (2, 1))]:  # fmt: skip
        b = np.concatenate(([0], np.cumsum(sizes)))
        row = {"sizes": list(sizes), "micro_batches": m, "slowdown": list(map(float, slow))}
        row["fwd_s"] = [sum(t["forward_s"][b[s] : b[s + 1]]) * slow[s] for s in range(2)]
        row["bwd_s"] = [sum(t["backward_s"][b[s] : b[s + 1]]) * slow[s] for s in range(2)]
        row["iteration_s"] = predict(JOB, cal, row)[1]
        rows.append(row)
    return rows


def test_the_fit_recovers_the_blocks_and_the_link_of_a_known_twin():
    gflops = np.array([b.fwd_gflops for b in digits_blocks(JOB)])
    f, b = 2e-4 + 1.5 * gflops, 1e-4 + 4.0 * gflops
    truth = calibration_of(JOB, f, b, (2e8, 3e-4), 10.0)
    rows = _rows(truth)
    f_fit, f_err, coef = fit_blocks(rows, JOB, "fwd_s")
    b_fit, _, _ = fit_blocks(rows, JOB, "bwd_s")
    np.testing.assert_allclose(f_fit, f, rtol=1e-6)
    np.testing.assert_allclose(b_fit, b, rtol=1e-6)
    assert coef == pytest.approx([2e-4, 1.5], rel=1e-6) and np.abs(f_err).max() < 1e-9
    (bw, lat), rms = fit_link(JOB, calibration_of(JOB, f_fit, b_fit, (1e9, 1e-4), 10.0), rows)
    assert rms < 1e-3
    for r in rows:  # the fitted twin predicts every plan's iteration time
        got = predict(JOB, calibration_of(JOB, f_fit, b_fit, (bw, lat), 10.0), r)[1]
        assert got == pytest.approx(r["iteration_s"], rel=5e-3)


def test_mdape_is_the_median_absolute_percentage():
    assert mdape([0.1, -0.3, 0.05]) == pytest.approx(10.0)
    assert np.isnan(mdape([]))


def test_rounds_interleave_the_plans_and_each_plan_keeps_the_medians_of_its_rounds(monkeypatch):
    from omegaconf import OmegaConf

    import experiments.pipeline_fidelity as fid

    started: list[tuple[int, ...]] = []
    level = iter([1.0, 1.0, 1.0, 9.0, 1.0, 1.0])  # one plan's second round measured under a load spike

    class FakePool:
        def __init__(self, bounds, **kw):
            started.append(tuple(bounds))
            self.factor = None

        def run(self, steps, first_step, slowdown):
            if self.factor is None:  # the warm-up call
                self.factor = 0.0
                return []
            self.factor = next(level)
            t = 0.01 * self.factor
            return [
                {"fwd_s": [t] * steps, "bwd_s": [2 * t] * steps, "step_s": [3 * t] * steps} for _ in slowdown
            ]

        def stop(self):
            return None, None

        def close(self):
            pass

    monkeypatch.setattr(fid, "StagePool", FakePool)
    plans = [{"sizes": [4, 4], "micro_batches": 16}, {"sizes": [2, 6], "micro_batches": 8, "held_out": True}]
    cfg = OmegaConf.create({"rounds": 3, "seed": 0, "timeout_s": 10, "warmup": 1, "steps": 2})
    rows, pauses = fid.measure_plans(JOB, plans, cfg)
    assert (
        started == [(0, 4, 8), (0, 2, 8)] * 3 and len(pauses) == 5
    )  # interleaved; no pause before the first
    assert [len(r["rounds"]) for r in rows] == [3, 3]
    assert rows[1]["iteration_s"] == pytest.approx(0.03)  # the spiked round (0.27 s) is outvoted
    assert rows[1]["rounds"][1]["iteration_s"] == pytest.approx(0.27) and rows[1]["held_out"]
    assert rows[0]["fwd_s"] == pytest.approx([0.01, 0.01]) and rows[0]["slowdown"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="rounds must be an integer >= 1, got 0"):
        fid.measure_plans(JOB, plans, OmegaConf.create({"rounds": 0}))
