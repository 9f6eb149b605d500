"""Fit the elastic job's learning-rate response to real training: how a multiplier ``m`` on the
learning rate changes progress per step.

    python -m experiments.fit_lr_response                   # conf/fit_lr_response.yaml

``sim.elastic`` models progress per step at ``m`` times the rule's learning rate as

    g(m) = m^a exp(-(m - 1)^2 / (2 w^2))                    (w = lr_tolerance, a = lr_exponent; g(1) = 1)

This app measures it on the one task that trains here: the digits CNN on a gloo CPU rank at a fixed
batch, its learning rate the base one times each multiplier of the elastic action's range
(``sim.elastic.LR_RANGE``), several seeds each. Progress is read as the iterations a run takes to
first reach ``target_accuracy`` (linear between validation points); the measured response of ``m``
is the mean over seeds of iterations at ``m = 1`` over iterations at ``m`` (> 1: faster). ``(w, a)``
are the least-squares fit of ``log g(m) / g(1)`` to the log of that response (``scipy.optimize``,
w in [0.05, 10], a in [0, 2]), the error is the RMS of the log residuals, and a bootstrap over seeds
gives their spread. Writes
``sim/data/lr_response.json`` (read by :class:`sim.elastic.ElasticJob` when ``lr_tolerance`` is not
given) and ``results/fit/lr_response.md``.

What it does not measure: a GPU model's response (ResNet-18 on CIFAR-10, the elastic pool's
workload), which no machine here trains; the fit stands in for it, with its task named in the file.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from scipy.optimize import minimize

from adapters.config import RealDDPConfig
from adapters.ddp_backend import DDPBackend
from sim.datafiles import atomic_write_text, dump_json
from sim.elastic import LR_RANGE, lr_progress_gain

log = logging.getLogger(__name__)

#: The search ranges of w (the response's width) and a (its exponent).
W_RANGE = (0.05, 10.0)
A_RANGE = (0.0, 2.0)


def iterations_to_target(curve: list[tuple[int, float]], target: float) -> float:
    """Iterations at which the (iterations, accuracy) curve first reaches ``target``, linear between
    its points; ``nan`` when it never does."""
    prev_it, prev_acc = 0, -math.inf
    for it, acc in curve:
        if acc >= target:
            if not math.isfinite(prev_acc) or acc == prev_acc:
                return float(it)
            return prev_it + (target - prev_acc) / (acc - prev_acc) * (it - prev_it)
        prev_it, prev_acc = it, acc
    return math.nan


def response(iterations: dict[float, list[float]]) -> dict[float, float]:
    """Measured response per multiplier: mean iterations at m = 1 over mean iterations at m."""
    if 1.0 not in iterations:
        raise ValueError("the multipliers must include 1.0 (the reference)")
    ref = float(np.mean(iterations[1.0]))
    return {m: ref / float(np.mean(v)) for m, v in iterations.items()}


def fit_response(measured: dict[float, float]) -> dict[str, Any]:
    """(w, a) of g(m) fitted to ``measured`` (multiplier -> response) in log space; the RMS log error."""
    ms = np.array(sorted(measured))
    y = np.log(np.array([measured[m] for m in ms]))

    def loss(x: np.ndarray) -> float:
        w, a = float(x[0]), float(x[1])
        pred = np.log([lr_progress_gain(float(m), w, a) for m in ms])  # g(1) = 1
        return float(np.mean((pred - y) ** 2))

    starts = [(0.25, 1.0), (1.0, 0.5), (3.0, 0.0), (0.5, 0.0)]
    best = min(
        (minimize(loss, np.array(x0), method="L-BFGS-B", bounds=[W_RANGE, A_RANGE]) for x0 in starts),
        key=lambda r: r.fun,
    )
    w, a = (float(v) for v in best.x)
    at_bound = any(
        abs(v - b) < 1e-3 * (hi - lo) for v, (lo, hi) in ((w, W_RANGE), (a, A_RANGE)) for b in (lo, hi)
    )
    return {
        "lr_tolerance": w,
        "lr_exponent": a,
        "rms_log_error": math.sqrt(loss(best.x)),
        "at_bound": at_bound,
    }


def run(cfg: DictConfig) -> dict[str, Any]:
    raw = OmegaConf.to_container(cfg, resolve=True)
    multipliers = [float(m) for m in raw["multipliers"]]
    lo, hi = LR_RANGE
    if any(not lo <= m <= hi for m in multipliers) or 1.0 not in multipliers:
        raise ValueError(
            f"multipliers must lie in the elastic range [{lo}, {hi}] and include 1.0, got {multipliers}"
        )
    seeds = [int(s) for s in raw["seeds"]]
    batch, per, intervals = int(raw["batch"]), int(raw["iterations_per_interval"]), int(raw["intervals"])
    target = float(raw["target_accuracy"])
    its: dict[float, list[float]] = {m: [] for m in multipliers}
    t0 = time.monotonic()
    for m in multipliers:
        config = RealDDPConfig(**{**raw["backend"], "base_lr": float(raw["backend"]["base_lr"]) * m})
        backend = DDPBackend(config)
        try:
            for seed in seeds:
                backend.reset(seed=seed)
                curve = []
                for k in range(intervals):
                    report = backend.run_interval(np.array([batch]), per)
                    curve.append(((k + 1) * per, float(report.val_accuracy)))
                    if report.val_accuracy >= target and k + 1 >= int(raw["min_intervals"]):
                        break
                n = iterations_to_target(curve, target)
                if not math.isfinite(n):
                    raise RuntimeError(
                        f"lr x{m} seed {seed} never reached target_accuracy {target} in {intervals * per} "
                        "iterations: raise intervals or lower the target"
                    )
                its[m].append(n)
                log.info("lr x%.2f seed %d: %.1f iterations to %.2f", m, seed, n, target)
        finally:
            backend.close()
    measured = response(its)
    fit = fit_response(measured)
    rng = np.random.default_rng(int(raw["bootstrap_seed"]))
    boot = []
    for _ in range(int(raw["bootstrap"])):
        idx = rng.integers(len(seeds), size=len(seeds))
        f = fit_response(response({m: [v[i] for i in idx] for m, v in its.items()}))
        boot.append((f["lr_tolerance"], f["lr_exponent"]))
    w, a = fit["lr_tolerance"], fit["lr_exponent"]
    fitted = {m: lr_progress_gain(m, w, a) for m in multipliers}
    peak = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * a * w * w))  # argmax of g: a/m = (m - 1)/w^2
    boot_arr = np.array(boot)
    doc = {
        "lr_tolerance": w,
        "lr_exponent": a,
        "rms_log_error": fit["rms_log_error"],
        "at_search_bound": fit["at_bound"],
        "bootstrap_lr_tolerance_p05_p95": [
            float(np.percentile(boot_arr[:, 0], 5)),
            float(np.percentile(boot_arr[:, 0], 95)),
        ],
        "bootstrap_lr_exponent_p05_p95": [
            float(np.percentile(boot_arr[:, 1], 5)),
            float(np.percentile(boot_arr[:, 1], 95)),
        ],
        "best_multiplier": peak,  # of the fitted curve
        "best_multiplier_in_range": min(max(peak, lo), hi),
        "measured_response": {str(m): v for m, v in measured.items()},
        "fitted_response": {str(m): v for m, v in fitted.items()},
        "iterations_to_target": {str(m): v for m, v in its.items()},
        "task": {
            "what": "real DDP, 1 gloo CPU rank, the digits CNN at a fixed batch, SGD at base_lr x multiplier",
            "batch": batch,
            "target_accuracy": target,
            "seeds": seeds,
            "backend": raw["backend"],
        },
        "command": "python -m experiments.fit_lr_response",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.monotonic() - t0,
    }
    atomic_write_text(Path(to_absolute_path(raw["out"])), dump_json(doc, digits=6))
    atomic_write_text(Path(to_absolute_path(raw["report"])), to_markdown(doc))
    log.info("lr_tolerance %.3f, lr_exponent %.3f (rms log error %.3f)", w, a, fit["rms_log_error"])
    return doc


def to_markdown(doc: dict[str, Any]) -> str:
    t = doc["task"]
    lines = [
        "# The learning-rate response of the elastic job (experiments/fit_lr_response.py)",
        "",
        f"`{doc['command']}` ({doc['measured_at']}, {doc['wall_s']:.0f} s): {t['what']}; batch {t['batch']}, "
        f"iterations to validation accuracy {t['target_accuracy']}, seeds {t['seeds']}.",
        "",
        "| lr multiplier | iterations to target (per seed) | measured response | fitted g(m) / g(1) |",
        "|---|---|---|---|",
    ]
    for m, v in doc["iterations_to_target"].items():
        lines.append(
            f"| {float(m):.2f} | {', '.join(f'{x:.0f}' for x in v)} | {doc['measured_response'][m]:.3f} | "
            f"{doc['fitted_response'][m]:.3f} |"
        )
    wl, wh = doc["bootstrap_lr_tolerance_p05_p95"]
    al, ah = doc["bootstrap_lr_exponent_p05_p95"]
    lines += [
        "",
        f"Fitted width w (`lr_tolerance`) **{doc['lr_tolerance']:.3f}** (bootstrap over seeds, 5-95%: {wl:.3f}-{wh:.3f}), "
        f"exponent a (`lr_exponent`) **{doc['lr_exponent']:.3f}** ({al:.3f}-{ah:.3f}); the fitted curve peaks at "
        f"x{doc['best_multiplier']:.2f}, so the best multiplier the elastic action allows is "
        f"x{doc['best_multiplier_in_range']:.2f}; RMS log error {doc['rms_log_error']:.3f}"
        + (" (a parameter at its search bound)" if doc["at_search_bound"] else "")
        + ". `sim.elastic.ElasticJob` reads them from `sim/data/lr_response.json` unless given.",
        "",
    ]
    return "\n".join(lines)


@hydra.main(version_base=None, config_path="../conf", config_name="fit_lr_response")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
