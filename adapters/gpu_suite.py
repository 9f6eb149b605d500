"""The GPU suite (issue 17): every check that needs a CUDA device, in one budgeted run.

    python -m adapters.gpu_suite OUT_DIR [--budget-s 450] [--parts gpu_check,ladder,overhead,race]
        [--ppo results/headline/policy] [--convergence-profile results/fidelity/profile] [--seeds 0,1]
    adapters/gpu_suite.sh              # on the GPU machine: wheels, the suite, the files for $OUT

Four parts, each in its own process group under its own share of the budget (a part that runs
past its share is killed with every rank it started, recorded as ``timed_out``, and the next part
starts); shares are re-divided over the parts still to run, so time one part leaves goes to the
rest:

1. ``gpu_check``: the CUDA device, DDP steps on CUDA tensors with several gloo ranks on the one GPU
   (NCCL refuses two ranks on one device), the uneven-batch gradient against one process's
   (:func:`adapters.gpu_check.gradient_check`), and an out-of-memory error provoked on purpose
   (in-process, then inside a DDP rank through the backend's probe) and stepped back from.
2. ``ladder``: step times in the reference table format (``sim/data/reference``) of ResNet-18 on
   CIFAR-shaped generated data at local batches 8-2048 on 1 and 4 ranks (batches the device memory
   cannot hold are left out and named), and of the race's CNN on MNIST; then
   ``python -m experiments.calibrate table=...`` (table mode) fits a GPU profile; reports its
   leave-one-batch-out and held-out step-time MdAPE.
3. ``overhead``: ``python -m experiments.bench_adapter device=cuda``: plain DDP against DDP with the
   drop-in controller, alternating segments, a bootstrap interval of the ratio.
4. ``race``: :mod:`adapters.gpu_race`: static batches, DLB, REX and a PPO bundle on 4 CUDA ranks
   with two ranks slowed to T4 speed beside two at V100 speed and a throttle window, on real MNIST
   images; the same race in the simulator calibrated by part 2; time to target and Kendall's tau.

Writes ``OUT_DIR/summary.json`` and ``OUT_DIR/summary.md`` (README-ready), each part's files under
``OUT_DIR/<part>/``. Without CUDA every part prints ``CUDA not available: skipping <part>`` and is
recorded as skipped: nothing here reports a GPU number it did not measure. Exit status 0 when every
part passed or was skipped, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from adapters.gpu_ladder import (
    calibrate_table,
    ddp_factory,
    ladder_table,
    memory_caps,
    run_group,
    write_table,
)

PARTS = ("gpu_check", "ladder", "overhead", "race")
#: Share of the budget of each part (re-divided over the parts left when one finishes early).
SHARES = {"gpu_check": 0.15, "ladder": 0.30, "overhead": 0.12, "race": 0.43}
#: Seconds each part is given beyond its share to exit cleanly before it is killed.
GRACE_S = 10.0
MAX_BUDGET_S = 480.0  # the 8 minutes
LADDER_BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
RACE_LADDER_BATCHES = (8, 16, 32, 64, 128, 256, 512)
HUGE_BATCH = 20_000  # cifar_synthetic's whole training set in one local batch: ~150 GiB for ResNet-18
RESULT = "result.json"


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def gpu_label(device_name: str) -> str:
    """A worker-type name for the profile from torch's device name: ``NVIDIA H200`` -> ``H200``."""
    words = device_name.replace("NVIDIA", "").split()
    label = re.sub(r"[^A-Za-z0-9]+", "", words[0]) if words else ""
    return label or "cuda"


# --------------------------------------------------------------------------------------------
# The parts (each runs in a child process: python -m adapters.gpu_suite OUT --run-part NAME)
# --------------------------------------------------------------------------------------------


def part_gpu_check(out: Path, budget_s: float, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from adapters.ddp_backend import DDPBackend
    from adapters.gpu_check import gradient_check
    from adapters.models import build_model

    props = torch.cuda.get_device_properties(0)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "total_mem_gib": props.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    # DDP steps on CUDA tensors: `ranks` gloo ranks sharing the one GPU, ResNet-18.
    ranks = int(args.ranks)
    be = DDPBackend(
        workers=ranks,
        device="cuda",
        dist_backend="gloo",
        model="resnet18",
        dataset="cifar_synthetic",
        target_accuracy=1.0,
        min_batch=8,
        max_batch=HUGE_BATCH,
        initial_batch=32,
    )
    try:
        be.reset(seed=0)
        rep = be.run_interval(np.full(ranks, 32), 5)
        # An out-of-memory error inside a rank: rank 0 asks for the whole training set at once while
        # this process holds all but 12 GiB of the device; the backend's probe catches the error,
        # every rank steps back to its last good batch, training goes on.
        huge = np.full(ranks, 32)
        huge[0] = HUGE_BATCH
        free, _ = torch.cuda.mem_get_info()
        blocker = torch.empty(max(int(free - 12 * 2**30), 0) // 4, dtype=torch.float32, device="cuda")
        try:
            rep_oom = be.run_interval(huge, 3)
        finally:
            del blocker
            torch.cuda.empty_cache()
        rep_after = be.run_interval(np.full(ranks, 32), 3)
    finally:
        be.close()
    res["ddp"] = {
        "ranks": ranks,
        "backend": "gloo",
        "iteration_time_s": float(np.mean(rep.iteration_time_s)),
        "alive": bool(rep.alive.all()),
        "gpu_mem_util": [float(x) for x in rep.gpu_mem_util],
    }
    res["rank_oom"] = {
        "requested": huge.tolist(),
        "applied": [int(b) for b in rep_oom.local_batch],
        "events": [e for e in rep_oom.events if "out of memory" in e],
        "next_interval_alive": bool(rep_after.alive.all()),
    }
    res["gradient_max_rel_diff"] = gradient_check()
    # In-process: ask for twice the device's memory, catch the error, free, train a step.
    try:
        x = torch.empty(int(2 * props.total_memory) // 4, dtype=torch.float32, device="cuda")
        del x
        raised, message = False, ""
    except torch.OutOfMemoryError as err:
        raised, message = True, str(err).splitlines()[0][:200]
    torch.cuda.empty_cache()
    net = build_model("resnet18", (3, 32, 32), 10).cuda()
    loss = F.cross_entropy(
        net(torch.randn(64, 3, 32, 32, device="cuda")), torch.zeros(64, dtype=torch.long, device="cuda")
    )
    loss.backward()
    torch.cuda.synchronize()
    res["process_oom"] = {"raised": raised, "message": message, "step_after_ok": bool(torch.isfinite(loss))}
    res["passed"] = bool(
        res["ddp"]["alive"]
        and res["gradient_max_rel_diff"] < 1e-3
        and res["rank_oom"]["applied"][0] < huge[0]
        and res["rank_oom"]["events"]
        and res["rank_oom"]["next_interval_alive"]
        and raised
        and res["process_oom"]["step_after_ok"]
    )
    return res


def part_ladder(out: Path, budget_s: float, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    t_end = time.monotonic() + budget_s
    label = gpu_label(torch.cuda.get_device_name(0))
    counts = [1, int(args.ranks)]
    caps = memory_caps("resnet18", (3, 32, 32), list(LADDER_BATCHES), counts)
    left_out = {w: sorted(set(LADDER_BATCHES) - set(bs)) for w, bs in caps["batches"].items()}
    calib_s = 40.0
    ladder_s = max(t_end - time.monotonic() - calib_s, 10.0)
    rows, notes = ladder_table(
        ddp_factory("cuda", "resnet18", "cifar_synthetic", caps["batches"], threads_per_worker=2),
        app="cifar10",
        gpu=label,
        model="ResNet-18/CIFAR-shaped generated data fp32, gloo ranks on one GPU",
        batches=caps["batches"],
        iterations=10,
        repeats=3,
        warmup_iterations=3,
        budget_s=0.8 * ladder_s,
    )
    # the race's model and data: those its convergence model was measured on
    from sim.profile import load_profile

    conv = load_profile(args.convergence_profile)
    real = (conv.meta.get("provenance") or {}).get("real_config") or {}
    race_model, race_data = str(real.get("model", "cnn")), str(real.get("dataset", "mnist"))
    race_batches = {w: list(RACE_LADDER_BATCHES) for w in counts}
    race_rows, race_notes = ladder_table(
        ddp_factory("cuda", race_model, race_data, race_batches, threads_per_worker=2),
        app=conv.workload.app,
        gpu=label,
        model=f"{race_model}/{race_data} fp32, gloo ranks on one GPU",
        batches=race_batches,
        iterations=10,
        repeats=3,
        warmup_iterations=3,
        budget_s=max(t_end - time.monotonic() - calib_s, 5.0),
    )
    table = write_table(out / "step_times.csv", rows + race_rows)
    fit = calibrate_table(
        table,
        out / "profile",
        name=f"gpu_{label.lower()}",
        app="cifar10",
        memory={label: caps["total_gib"]},
        timeout_s=max(t_end - time.monotonic(), 20.0),
    )
    return {
        "gpu": label,
        "table": str(table),
        "rows": len(rows) + len(race_rows),
        "memory": {"per_sample_mib": caps["per_sample_mib"], "total_gib": caps["total_gib"]},
        "left_out_for_memory": {str(w): b for w, b in left_out.items() if b},
        "notes": notes + race_notes,
        "calibrate": fit,
        "passed": bool(rows and race_rows and math.isfinite(fit["holdout_mdape_all"] or math.nan)),
    }


def part_overhead(out: Path, budget_s: float, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "experiments.bench_adapter",
        "device=cuda",
        "workers=2",
        "model=resnet18",
        "dataset=cifar_synthetic",
        "batch=128",
        "interval=20",
        "iterations=30",
        f"rounds={int(args.overhead_rounds)}",
        f"out={out / 'overhead.json'}",
        f"hydra.run.dir={out / 'hydra'}",
    ]
    rc = run_group(cmd, budget_s, log_path=out / "bench_adapter.log")
    if rc != 0:
        raise RuntimeError(f"experiments.bench_adapter exited with {rc}; see {out / 'bench_adapter.log'}")
    res = json.loads((out / "overhead.json").read_text())
    keep = ("ratio_median", "ratio_total", "ratio_total_ci95", "ratio_min", "self_fraction", "config")
    return {**{k: res[k] for k in keep}, "command": "python " + " ".join(cmd[1:]), "passed": True}


def part_race(out: Path, budget_s: float, args: argparse.Namespace) -> dict[str, Any]:
    from adapters.gpu_race import race

    ladder = (
        json.loads((out.parent / "ladder" / RESULT).read_text())
        if (out.parent / "ladder" / RESULT).is_file()
        else {}
    )
    if ladder.get("status") != "ok":
        raise RuntimeError("the race needs the GPU profile of part `ladder`, which did not finish")
    return race(
        out,
        budget_s,
        gpu_profile=Path(ladder["result"]["calibrate"]["profile_dir"]),
        gpu=ladder["result"]["gpu"],
        convergence_profile=args.convergence_profile,
        ppo=args.ppo,
        seeds=[int(s) for s in args.seeds.split(",")],
        workers=int(args.ranks),
    )


RUNNERS = {"gpu_check": part_gpu_check, "ladder": part_ladder, "overhead": part_overhead, "race": part_race}


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def write_result(path: Path, doc: dict[str, Any]) -> None:
    from sim.datafiles import atomic_write_text

    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def child(args: argparse.Namespace) -> int:
    """One part, in this process; its result (or its error) goes to ``OUT/<part>/result.json``."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    out = Path(args.out_dir) / args.run_part
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        result = RUNNERS[args.run_part](out, float(args.part_budget_s), args)
        doc = {"status": "ok" if result.get("passed") else "failed", "result": result}
    except Exception as err:  # recorded, then the driver goes on to the next part
        import traceback

        traceback.print_exc()
        doc = {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
    doc["wall_s"] = time.monotonic() - t0
    write_result(out / RESULT, doc)
    return 0


def drive(args: argparse.Namespace) -> int:
    out = Path(args.out_dir)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise SystemExit(f"--parts: unknown part(s) {bad or parts}; choose from {list(PARTS)}")
    if not 10.0 <= args.budget_s <= MAX_BUDGET_S:
        raise SystemExit(f"--budget-s must be in [10, {MAX_BUDGET_S:.0f}] seconds, got {args.budget_s}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cuda = cuda_available()
    machine: dict[str, Any] = {"cuda": cuda, "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    if cuda:
        import torch

        machine.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    results: dict[str, Any] = {}
    for i, part in enumerate(parts):
        if not cuda:
            print(f"CUDA not available: skipping {part}", flush=True)
            results[part] = {"status": "skipped", "reason": "CUDA not available"}
            continue
        left = args.budget_s - (time.monotonic() - t0)
        share = SHARES[part] / sum(SHARES[p] for p in parts[i:])
        budget = left * share - GRACE_S
        if budget < 5.0:
            print(f"out of time: skipping {part}", flush=True)
            results[part] = {"status": "skipped", "reason": f"out of time ({left:.0f} s left)"}
            continue
        print(f"[{time.monotonic() - t0:6.1f} s] {part}: budget {budget:.0f} s", flush=True)
        (out / part).mkdir(exist_ok=True)
        (out / part / RESULT).unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "adapters.gpu_suite",
            str(out),
            "--run-part",
            part,
            "--part-budget-s",
            f"{budget:.1f}",
        ]
        cmd += [f"--{k.replace('_', '-')}={v}" for k, v in shared_options(args).items()]
        rc = run_group(cmd, budget + GRACE_S, log_path=out / part / "log.txt")
        if rc == 124:
            results[part] = {
                "status": "timed_out",
                "reason": f"ran past {budget + GRACE_S:.0f} s and was killed",
            }
        elif (out / part / RESULT).is_file():
            results[part] = json.loads((out / part / RESULT).read_text())
        else:
            results[part] = {
                "status": "failed",
                "reason": f"exited with {rc} and no result; see {part}/log.txt",
            }
        results[part]["budget_s"] = budget
        print(f"[{time.monotonic() - t0:6.1f} s] {part}: {results[part]['status']}", flush=True)
    summary = {
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python -m adapters.gpu_suite " + " ".join(sys.argv[1:]),
        "machine": machine,
        "budget_s": args.budget_s,
        "wall_s": time.monotonic() - t0,
        "parts": results,
    }
    write_result(out / "summary.json", summary)
    from sim.datafiles import atomic_write_text

    atomic_write_text(out / "summary.md", summary_markdown(summary))
    print(f"wrote {out / 'summary.json'} and {out / 'summary.md'} in {summary['wall_s']:.0f} s", flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results.values()) else 1


def shared_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("ppo", "convergence_profile", "seeds", "ranks", "overhead_rounds")}


def _pct(x: Any) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{100 * float(x):.1f}%"


def summary_markdown(s: dict[str, Any]) -> str:
    m = s["machine"]
    where = m.get("device") or "no CUDA device"
    lines = [
        "# GPU suite",
        "",
        "```bash",
        s["command"],
        "```",
        "",
        f"{s['created_utc']} on {where} ({m['cpu_count']} CPU cores); {s['wall_s']:.0f} s of a "
        f"{s['budget_s']:.0f} s budget.",
        "",
        "| part | status | wall s | result |",
        "|---|---|---|---|",
    ]
    for part, r in s["parts"].items():
        wall = f"{r['wall_s']:.0f}" if "wall_s" in r else ""
        lines.append(f"| {part} | {r['status']} | {wall} | {part_line(part, r)} |")
    return "\n".join(lines) + "\n"


def part_line(part: str, r: dict[str, Any]) -> str:
    if "result" not in r:
        return r.get("reason", "")
    x = r["result"]
    if part == "gpu_check":
        return (
            f"{x['device']}: {x['ddp']['ranks']} gloo ranks on one GPU, {1e3 * x['ddp']['iteration_time_s']:.1f} ms/step; "
            f"gradient vs one process {x['gradient_max_rel_diff']:.1e}; rank OOM stepped back to "
            f"{x['rank_oom']['applied'][0]}; in-process OOM raised: {x['process_oom']['raised']}"
        )
    if part == "ladder":
        c = x["calibrate"]
        loo = ", ".join(f"{k} {_pct(v)}" for k, v in c["loo_mdape"].items())
        out = f"{x['rows']} rows; leave-one-batch-out step-time MdAPE {loo}; held-out (every 2nd batch) {_pct(c['holdout_mdape_all'])}"
        if x["left_out_for_memory"]:
            out += f"; left out for memory (ranks: batches) {x['left_out_for_memory']}"
        return out
    if part == "overhead":
        lo, hi = x["ratio_total_ci95"]
        return (
            f"controller / plain DDP {x['ratio_total']:.4f} (95% bootstrap [{lo:.4f}, {hi:.4f}]), median "
            f"{x['ratio_median']:.4f}; controller's own time {100 * x['self_fraction']:.2f}%"
        )
    if part == "race":
        tta = "; ".join(
            f"{c}: real {v['real_s']:.1f} s, sim {v['sim_s']:.1f} s" for c, v in x["time_to_target"].items()
        )
        return (
            f"Kendall tau {x['kendall_tau']:.2f} (real order {x['order_real']}, sim {x['order_sim']}); {tta}"
        )
    return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m adapters.gpu_suite", description=__doc__.split("\n")[0])
    p.add_argument("out_dir", help="folder for summary.json, summary.md and each part's files")
    p.add_argument("--budget-s", type=float, default=450.0, help=f"wall-time budget, 10-{MAX_BUDGET_S:.0f} s")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--ppo", default="results/headline/policy", help="PPO bundle for the race")
    p.add_argument(
        "--convergence-profile",
        default="results/fidelity/profile",
        help="profile whose convergence model (measured on the race's model and data) the race's simulator uses",
    )
    p.add_argument("--seeds", default="0,1", help="race seeds, comma-separated")
    p.add_argument("--ranks", type=int, default=4, help="ranks on the one GPU (gpu_check, ladder, race)")
    p.add_argument(
        "--overhead-rounds", type=int, default=6, help="alternating segment pairs of the overhead part"
    )
    p.add_argument("--run-part", choices=PARTS, help=argparse.SUPPRESS)
    p.add_argument("--part-budget-s", type=float, default=60.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error(f"--ranks must be >= 2, got {args.ranks}")
    if args.overhead_rounds < 3:
        p.error(f"--overhead-rounds must be >= 3 (a bootstrap interval needs 3), got {args.overhead_rounds}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds:
        p.error("--seeds needs at least one seed")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return child(args) if args.run_part else drive(args)


if __name__ == "__main__":
    sys.exit(main())
