"""The batched-env benchmark's accounting, end to end on a tiny grid (speed goals live in the
benchmark itself, not here)."""

from __future__ import annotations

from experiments import bench_batched


def test_measure_reports_each_batch_size_with_memory_and_plots(tmp_path):
    res = bench_batched.measure(4, "mixed", 10, [1, 3], 0.01, 0, 1, 2, [3])
    assert res["workers"] == 4 and res["per_cluster_steps_per_s"] > 0
    assert [r["batch"] for r in res["rows"]] == [1, 3]
    for r in res["rows"]:
        assert r["batched_steps_per_s"] > 0 and r["peak_mib"] > 0
        assert r["speedup"] == r["batched_steps_per_s"] / res["per_cluster_steps_per_s"]
        assert r["speedup_cpu"] == r["batched_steps_per_s_cpu"] / res["per_cluster_steps_per_s_cpu"]
        assert r["draws_bound_speedup_cpu"] == r["draws_steps_per_s_cpu"] / res["per_cluster_steps_per_s_cpu"]
        assert r["draws_steps_per_s_cpu"] > 0 and "rss_growth_mib" in r
    assert res["rows"][0]["stream_steps_per_s"] is None and res["rows"][1]["stream_steps_per_s"] > 0
    assert res["rows"][1]["peak_mib"] > res["rows"][0]["peak_mib"]  # three clusters hold more than one
    bench_batched.plot([{"scenario": "mixed", **res}], tmp_path / "batched.png", {4: 10})
    assert (tmp_path / "batched.png").stat().st_size > 1000
