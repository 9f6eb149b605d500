"""The GPU suite's step-time ladder (:mod:`adapters.gpu_suite`, part ``ladder``): measured step
times over a batch ladder and worker counts as rows of the reference table format
(``sim/data/reference/README.md``), the local batches the device memory holds, and the table-mode
fit by ``python -m experiments.calibrate table=...``.

Any backend runs the ladder (real DDP ranks through :func:`ddp_factory` on the GPU, the simulator
in the CPU tests): :func:`ladder_table` drives it through the backend protocol only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def ladder_table(
    make_backend: Callable[[int], Any],
    *,
    app: str,
    gpu: str,
    model: str,
    batches: dict[int, list[int]],
    iterations: int,
    repeats: int,
    warmup_iterations: int,
    budget_s: float,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Measured step times as rows of the reference format, and notes on what was left out.

    ``make_backend(workers)``: a backend (:class:`adapters.ddp_backend.DDPBackend`, or any other)
    of that many workers whose local-batch range covers ``batches``, one worker count -> its
    ladder. Batches common to every count are measured first, all counts alike
    (:func:`dynamix_gym.measurement.profiling.profile_ladder`: when the budget runs out the top of the ladder
    is missing for every count); the batches only some counts can hold follow with what is left.
    Rows carry worker type ``gpu`` and application ``app``; ``model`` describes them.
    """
    from dynamix_gym.measurement.profiling import profile_ladder, reference_rows

    if not batches or any(not b for b in batches.values()):
        raise ValueError(f"batches needs a non-empty ladder per worker count, got {batches!r}")
    common = sorted(set.intersection(*(set(bs) for bs in batches.values())))
    t_end = time.monotonic() + float(budget_s)
    notes: list[str] = []
    done = []
    backends: dict[int, Any] = {}
    try:
        for w in sorted(batches):
            backends[w] = make_backend(w)
        rounds = [(dict(backends), common)] if common else []
        for w in sorted(batches):
            extra = sorted(set(batches[w]) - set(common))
            if extra:
                rounds.append(({w: backends[w]}, extra))
        for group, ladder in rounds:
            left = t_end - time.monotonic()
            if left <= 1.0:
                notes.append(f"out of time before {sorted(group)} ranks at local batches {ladder}")
                continue
            res = profile_ladder(
                group,
                ladder,
                iterations=iterations,
                repeats=repeats,
                warmup_iterations=warmup_iterations,
                budget_s=left,
                progress=False,
            )
            if res.stopped_early:
                notes.append(res.message())
            done.append(res)
    finally:
        for be in backends.values():
            be.close()
    rows = [{**row, "gpu": gpu} for res in done for row in reference_rows(res, app, model)]
    rows.sort(key=lambda r: (r["app"], r["num_gpus"], r["local_batch"]))
    return rows, notes


def ddp_factory(
    device: str, model: str, dataset: str, batches: dict[int, list[int]], threads_per_worker: int = 1
) -> Callable[[int], Any]:
    """``make_backend`` for :func:`ladder_table`: real DDP ranks (gloo) on ``device``."""
    from adapters.config import RealDDPConfig
    from adapters.ddp_backend import DDPBackend

    every = sorted({b for bs in batches.values() for b in bs})

    def make(workers: int) -> DDPBackend:
        return DDPBackend(
            RealDDPConfig(
                workers=workers,
                device=device,
                dist_backend="gloo",
                dataset=dataset,
                model=model,
                min_batch=every[0],
                max_batch=every[-1],
                base_batch=every[0],
                initial_batch=every[0],
                target_accuracy=1.0,  # profiling never stops at a target
                threads_per_worker=threads_per_worker,
            )
        )

    return make


def write_table(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Validate ``rows`` as a reference table (:func:`sim.fitting.table.read_profile_table`) and write it."""
    import pandas as pd

    from sim.datafiles import atomic_write_text
    from sim.fitting.table import read_profile_table

    table = read_profile_table(pd.DataFrame(rows))
    atomic_write_text(path, table.to_csv(index=False))
    return path


def memory_caps(model: str, input_shape: tuple[int, ...], ladder: list[int], counts: list[int]) -> dict:
    """Per worker count, the ladder batches whose training step the device memory holds with that
    many ranks on it: per-sample memory from the peak of one fwd+bwd at two batches, 25% headroom."""
    import torch
    import torch.nn.functional as F

    from adapters.models import build_model

    net = build_model(model, input_shape, 10).cuda()
    peaks = {}
    for b in (32, 64):
        torch.cuda.reset_peak_memory_stats()
        x = torch.randn(b, *input_shape, device="cuda")
        F.cross_entropy(net(x), torch.zeros(b, dtype=torch.long, device="cuda")).backward()
        torch.cuda.synchronize()
        peaks[b] = torch.cuda.max_memory_allocated()
        net.zero_grad(set_to_none=True)
    per_sample = max((peaks[64] - peaks[32]) / 32, 1.0)
    fixed = max(peaks[32] - 32 * per_sample, 0.0) + 1.5 * 2**30  # + CUDA context and data per rank
    total = torch.cuda.get_device_properties(0).total_memory
    del net
    torch.cuda.empty_cache()
    caps = {w: [b for b in ladder if w * 1.25 * (fixed + b * per_sample) < 0.9 * total] for w in counts}
    return {"batches": caps, "per_sample_mib": per_sample / 2**20, "total_gib": total / 2**30}


def calibrate_table(
    table: Path, out_dir: Path, name: str, app: str, memory: dict[str, float], timeout_s: float
):
    """``python -m experiments.calibrate table=...`` (table mode) into ``out_dir``; the fitted
    profile's leave-one-batch-out and held-out step-time MdAPE per (worker type, app)."""
    # The table argument was called `profile=` before; ask the config which name it has.
    arg = (
        "table" if re.search(r"^table:", (REPO / "conf" / "calibrate.yaml").read_text(), re.M) else "profile"
    )
    cmd = [
        sys.executable,
        "-m",
        "experiments.calibrate",
        f"{arg}={table}",
        f"out_dir={out_dir}",
        f"name={name}",
        f"app={app}",
        "progress=false",
        f"hydra.run.dir={out_dir}/hydra",
        *(f"+gpu_memory_gib.{g}={v:.1f}" for g, v in memory.items()),
    ]
    proc = run_group(cmd, timeout_s, log_path=out_dir.parent / "calibrate.log")
    if proc != 0:
        raise RuntimeError(f"{' '.join(cmd[1:4])} exited with {proc}; see {out_dir.parent / 'calibrate.log'}")
    models = json.loads((out_dir / "compute_models.json").read_text())["models"]
    cal = json.loads((out_dir / "calibration.json").read_text())
    return {
        "command": "python " + " ".join(cmd[1:]),
        "profile_dir": str(out_dir),
        "loo_mdape": {f"{m['gpu']}/{m['app']}": float(m["loo_mdape"]) for m in models},
        "loo_per_batch": {f"{m['gpu']}/{m['app']}": m.get("loo_per_batch") for m in models},
        "holdout_mdape": cal["holdout"].get("mdape", {}),
        "holdout_mdape_all": cal["holdout"].get("mdape_all"),
    }


def run_group(cmd: list[str], timeout_s: float, log_path: Path) -> int:
    """Run ``cmd`` in its own process group, output to ``log_path``; on timeout kill the group
    (every rank it spawned with it) and return 124."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return 124
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
