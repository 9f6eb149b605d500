"""Real elastic DDP (gloo, CPU ranks): a 1 -> 2 -> 1 change ends where an unchanged run ends, with
its restarts measured; a restart that fails leaves the last complete checkpoint and nothing
half-written; bad world sizes name the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support import ranks_alive

from adapters import checkpoint as ckpt
from adapters.config import RealDDPConfig
from adapters.elastic import ElasticDDPBackend, run_schedule, split_global_batch


def _config(root, **kw) -> RealDDPConfig:
    base = dict(
        workers=1,
        checkpoint_dir=str(root),
        min_batch=4,
        max_batch=256,
        base_batch=32,
        target_accuracy=1.0,
        timeout_s=30,
    )
    return RealDDPConfig(**{**base, **kw})


def test_split_keeps_the_global_batch_and_names_the_range():
    assert split_global_batch(65, 2, 4, 256) == [33, 32]
    with pytest.raises(ValueError, match=r"\[min_batch, max_batch\] = \[40, 256\]"):
        split_global_batch(64, 2, 40, 256)


def test_bad_world_sizes_and_configs_name_the_field(tmp_path):
    backend = ElasticDDPBackend(_config(tmp_path), max_workers=2)
    for bad in (0, 3, 1.5, True):
        with pytest.raises(ValueError, match="world_size"):
            backend.resize(bad)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        ElasticDDPBackend(RealDDPConfig(workers=1))
    with pytest.raises(ValueError, match=r"config\.max_batch"):
        ElasticDDPBackend(_config(tmp_path, workers=2, max_batch=(64, 64)))
    backend.close()


def test_a_failed_restart_leaves_the_last_complete_checkpoint_and_no_staging_folder(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    folder = ckpt.checkpoint_path(root, 3)
    folder.mkdir(parents=True)
    ckpt.atomic_torch_save({"model": {}}, folder / "worker.pt")
    ckpt.atomic_torch_save({"interval": 3, "batches": [64], "good": [64]}, folder / "coordinator.pt")
    ckpt.commit(root, 3)
    before = (root / ckpt.LATEST).read_text()
    backend = ElasticDDPBackend(_config(root))

    def broken(obj, path):
        open(path, "wb").write(b"half")  # a partial file, then the failure
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "atomic_torch_save", broken)
    with pytest.raises(OSError, match="disk full"):
        backend._stage(folder, 2)
    assert (root / ckpt.LATEST).read_text() == before
    assert sorted(p.name for p in root.iterdir()) == sorted([ckpt.LATEST, folder.name])
    assert ckpt.latest(root) == folder
    monkeypatch.undo()
    staged = backend._stage(folder, 2)  # a restart that works moves the pointer only at the end
    assert json.loads((root / ckpt.LATEST).read_text())["path"] == staged.name
    meta = torch.load(staged / "coordinator.pt", weights_only=False)
    assert meta["batches"] == [32, 32]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.integration
def test_one_two_one_ranks_end_at_the_accuracy_of_an_unchanged_run(tmp_path):
    schedule = [1, 1, 1, 2, 2, 2, 1, 1, 1]
    kw = {"global_batch": 64, "iterations": 20}
    unchanged = [
        run_schedule(_config(tmp_path / f"u{s}"), [1] * len(schedule), seed=s, **kw)["final_accuracy"]
        for s in (0, 1)
    ]
    elastic = run_schedule(_config(tmp_path / "e"), schedule, seed=0, **kw)
    assert elastic["world_sizes"] == schedule
    lo, hi = min(unchanged), max(unchanged)
    spread = max(hi - lo, 0.01)
    assert lo - spread <= elastic["final_accuracy"] <= hi + spread, (elastic, unchanged)
    restarts = elastic["restarts"]
    assert [(r["from_ranks"], r["to_ranks"]) for r in restarts] == [(1, 2), (2, 1)]
    assert all(r["restart_s"] > 0 for r in restarts)
    assert elastic["wall_time_s"] >= sum(r["restart_s"] for r in restarts)
    assert not ranks_alive()  # every rank of every group was reaped
    assert np.isfinite(elastic["accuracy"]).all()
