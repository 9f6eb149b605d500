"""Real pipeline stage ranks (CPU gloo, torch.distributed.pipelining): a re-partition loses no
step, and a hung rank is named within the timeout with no process left behind."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from adapters.real_pipeline.ranks import StageRankError, run_stages

pytestmark = pytest.mark.integration


@pytest.mark.slow  # 27 s of real stage ranks (make test-slow): keeps make test under 5 minutes
def test_repartition_loses_no_step():
    whole = run_stages([0, 4, 8], steps=6, timeout_s=240)
    first = run_stages([0, 4, 8], steps=3, timeout_s=240)
    second = run_stages(
        [0, 5, 8], steps=3, state=first["state"], optim=first["optim"], first_step=3, timeout_s=240
    )
    assert sorted(second["state"]) == [f"b{i}" for i in range(8)]
    for name, tensors in whole["state"].items():
        for key, value in tensors.items():
            np.testing.assert_allclose(second["state"][name][key], value, rtol=1e-5, atol=1e-6)
    assert second["state"]["b0"]["0.weight"].shape == (128, 64)


@pytest.mark.slow  # waits out a 90 s stage timeout (make test-slow); DDP's hung rank is in make test
def test_hung_rank_is_named_and_nothing_is_left():
    with pytest.raises(StageRankError, match="rank 1") as err:
        run_stages([0, 4, 8], steps=3, slowdown=[1.0, 1e6], timeout_s=90)
    assert 1 in err.value.ranks
    assert multiprocessing.active_children() == []


def test_bad_cuts_are_refused():
    with pytest.raises(ValueError, match="cuts"):
        run_stages([0, 8, 8], steps=1)
