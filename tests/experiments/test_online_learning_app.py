"""experiments.online_learning end to end on a tiny stream (real gRPC on 127.0.0.1)."""

from __future__ import annotations

import json

import pytest
from support import run_app


@pytest.mark.slow
def test_a_tiny_stream_writes_the_curve_and_the_poison_check(tmp_path):
    out = tmp_path / "online"
    proc = run_app(
        "experiments.online_learning",
        "stream.tasks=[ncf_t4v100_mixed]",
        "stream.waves=3",
        "stream.update_every_waves=2",
        "learner.replica_episodes=4",  # the default replica learner, kept small
        "learner.replica_epochs=1",
        "learner.validation_score=geomean",
        "validation.tasks=[ncf_t4v100_jitter]",
        "validation.seeds=[100]",
        "poison.transitions=256",
        "poison.waves=1",
        f"out_dir={out}",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((out / "online.json").read_text())
    assert len(r["waves"]) == 3
    updates = [w["update"] for w in r["waves"]]
    assert (
        updates[0] is None and updates[1] is not None and updates[2] is None
    )  # after every 2nd wave, not the last
    assert updates[1]["validation_ratio_to_parent"] > 0
    assert r["curve"][0]["version"] == 0 and r["curve"][0]["ratio_to_pretrained"] == 1.0
    assert r["poison"]["validation_gate"]["status"] in ("promoted", "rejected")
    assert r["learner"]["mode"] == "replica" and r["learner"]["rollback_test"] == "stratified"
    assert all("measured_tta_ratio" in c for c in r["curve"])
    assert (out / "online.md").read_text().startswith("# Online fine-tuning")
