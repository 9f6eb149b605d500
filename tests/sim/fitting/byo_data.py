"""A generated application in the reference formats: step times on T4 and V100 and convergence
traces of a falling, WER-like metric (percent), for the bring-your-own-workload tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from support import ROOT

M0 = 32
BATCHES = (32, 64, 128, 256)
PROGRESS_PER_EPOCH = 625.0
EPOCHS = 12
#: (alpha_s, beta_s) of T_compute(b) = alpha + beta b, and (sync at R = 2, per extra replica) s.
GPUS = {"T4": ((0.03, 0.004), (0.02, 0.004)), "V100": ((0.015, 0.002), (0.01, 0.002))}
PLACEMENTS = {"T4": ("1", "2", "4", "22", "44"), "V100": ("1", "2", "4", "8", "44", "88")}
LOCAL_BATCHES = (4, 8, 16, 32, 64)

WORKLOAD_YAML = """\
name: asr_byo
model: "Conformer-S / LibriSpeech-like (generated)"
params_millions: 10.3
samples_per_epoch: 20000
target_accuracy: 15.0            # WER, percent: the episode ends at or below it
val_samples: 2600
initial_local_batch: 16
time_budget_s: 3600.0
metric:
  name: wer
  higher_is_better: false
  scale: 0.01
  untrained: 100.0
"""


def throughput_table(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for gpu, ((a, b), (s2, s_per)) in GPUS.items():
        for pl in PLACEMENTS[gpu]:
            r = sum(int(c) for c in pl)
            for lb in LOCAL_BATCHES:
                comp = (a + b * lb) * math.exp(0.02 * rng.standard_normal())
                sync = 0.0 if r == 1 else (s2 + s_per * (r - 2)) * (1.5 if len(pl) > 1 else 1.0)
                rows.append({
                    "gpu": gpu, "app": "asr_byo", "model": "generated", "placement": pl,
                    "num_nodes": len(pl), "num_gpus": r, "local_batch": lb,
                    "step_time_s": comp + sync, "sync_time_s": sync if r > 1 else 0.0005,
                })  # fmt: skip
    return pd.DataFrame(rows)


def quality(progress: np.ndarray, batch: int) -> np.ndarray:
    """1 - WER / 100 of a static run: a ceiling that drops 1 point per doubling, progress stretched."""
    doublings = math.log2(batch / M0)
    ceiling = 0.90 - 0.01 * doublings
    return ceiling * (1.0 - np.exp(-progress / 2 ** (0.1 * doublings) / 1500.0))


def noise_scale(progress: np.ndarray) -> np.ndarray:
    return 50.0 * (1.0 + progress / 500.0)


def traces_table(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for m in BATCHES:
        grid = np.linspace(0.0, EPOCHS * PROGRESS_PER_EPOCH, 4001)
        b = noise_scale(grid)
        inv_r = 1.0 / ((m / M0) * (b + M0) / (b + m))
        steps = np.concatenate([[0.0], np.cumsum(np.diff(grid) * 0.5 * (inv_r[1:] + inv_r[:-1]))])
        for e in range(1, EPOCHS + 1):
            p = e * PROGRESS_PER_EPOCH
            g2 = 10.0 * math.exp(-p / 2000.0)
            wer = 100.0 * (1.0 - float(quality(np.array([p]), m)[0])) + 0.2 * rng.standard_normal()
            rows.append({
                "app": "asr_byo", "model": "generated", "global_batch": m, "epoch": e, "progress": p,
                "iteration": round(float(np.interp(p, grid, steps))), "metric": round(wer, 3),
                "grad_sqr": g2, "grad_var": g2 * float(noise_scale(np.array([p]))[0]) / M0,
            })  # fmt: skip
    return pd.DataFrame(rows)


def write_inputs(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = {"table": root / "throughput.csv", "traces": root / "traces.csv", "workload": root / "asr.yaml"}
    throughput_table().to_csv(paths["table"], index=False)
    traces_table().to_csv(paths["traces"], index=False)
    paths["workload"].write_text(WORKLOAD_YAML)
    return paths


#: Epochs of the clipped traces: long enough for |G|^2 to sink below its estimate's noise.
CLIPPED_EPOCHS = 30


def clipped_traces_table(seed: int = 11) -> pd.DataFrame:
    """The traces as a Pollux / AdaptDL-style measurement writes them: AdaptDL's squared-gradient
    estimate is a difference of two noisy norms, reported as ``max(estimate, 0)`` (its variance
    estimate as ``max(estimate, 1e-6)``), so once |G|^2 sinks below the estimate's noise late in
    training, scattered late epochs carry ``grad_sqr = 0``."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in BATCHES:
        for e in range(1, CLIPPED_EPOCHS + 1):
            p = e * PROGRESS_PER_EPOCH
            g2 = 10.0 * math.exp(-p / 2000.0)
            var = g2 * float(noise_scale(np.array([p]))[0]) / M0
            sqr_est = g2 + 0.02 * rng.standard_normal()  # the estimate's noise: 0.02
            wer = 100.0 * (1.0 - float(quality(np.array([p]), m)[0])) + 0.2 * rng.standard_normal()
            rows.append({
                "app": "asr_byo", "model": "generated", "global_batch": m, "epoch": e, "progress": p,
                "iteration": round(p * M0 / m), "metric": round(wer, 3),
                "grad_sqr": max(sqr_est, 0.0), "grad_var": max(var, 1e-6),
            })  # fmt: skip
    return pd.DataFrame(rows)


def calibrate_config(inputs: dict[str, Path], out: Path, traces: bool = True) -> DictConfig:
    """``experiments.calibrate``'s config for the files of :func:`write_inputs` (without the traces:
    the shipped convergence model of the workload's name)."""
    overrides = [f"table={inputs['table']}", f"workload_file={inputs['workload']}", f"out_dir={out}"]
    if traces:
        overrides.append(f"traces={inputs['traces']}")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("calibrate", overrides=overrides)
