"""DynPipe's interference predictor and its data-parallel trigger (controller dynpipe_dp)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from support import ROOT

from dynamix_gym.controllers.dynpipe_dp import DynPipeDPController
from dynamix_gym.controllers.interference import (
    FEATURES,
    InterferenceFeatures,
    SlowdownPredictor,
    true_slowdown,
)
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from sim.faults import get_scenario, scale_intensity


def test_shipped_forest_separates_slowed_from_unslowed_workers_on_a_fresh_run():
    predictor = SlowdownPredictor.load(ROOT / "results" / "interference")
    assert (
        predictor.meta["features"] == list(FEATURES)
        and min(s["seed"] for s in predictor.meta["episodes"]) >= 100
    )
    scenario = scale_intensity(get_scenario("interference"), 6.0)
    env = HeteroClusterEnv(workers=8, scenario=scenario, workload="ncf", action_mode="absolute")
    _, info = env.reset(seed=4242)  # a seed the fit never saw
    feats = InterferenceFeatures(env.backend.spec)
    pred, truth = [], []
    for _ in range(60):
        report = info["report"]
        pred.append(predictor.predict(feats.update(report)))
        truth.append(true_slowdown(report))
        _, _, term, trunc, info = env.step(env.unwrapped.batches.astype(np.float32))
        if term or trunc:
            break
    pred, truth = np.concatenate(pred), np.concatenate(truth)
    slowed = truth > 1.3
    assert slowed.any() and (~slowed).any()
    assert pred[slowed].mean() > 1.2 > pred[~slowed].mean()


class StubPredictor:
    def __init__(self) -> None:
        self.value = np.ones(4)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.value.copy()


def _reports():
    env = HeteroClusterEnv(workers=4, scenario="static_hetero", action_mode="absolute")
    _, info = env.reset(seed=1)
    return env.backend.spec, info["report"]


def test_trigger_needs_a_sustained_slowdown_and_respects_the_cooldown():
    spec, report = _reports()
    ctl = DynPipeDPController(threshold=1.2, sustain_s=30.0, cooldown_s=300.0, plan_intervals=1)
    ctl.reset(spec)
    stub = ctl.predictor = StubPredictor()
    batches = spec.initial_batch.copy()

    def step(t: float) -> np.ndarray:
        nonlocal batches
        r = replace(report, wall_time_s=t, local_batch=batches)
        batches = ctl.predict(None, {"report": r, "local_batches": batches})[0].astype(np.int64)
        return batches

    step(10.0)  # the plan
    assert [s["why"] for s in ctl.splits] == ["plan"]
    stub.value = np.array([1.0, 1.5, 1.0, 1.0])  # worker 1 slowed from t=20 s
    for t in (20.0, 35.0):
        step(t)
    assert len(ctl.splits) == 1  # 15 s < sustain_s
    step(400.0)  # sustained for 380 s and 390 s since the plan: re-split
    assert ctl.splits[-1] == {"wall_time_s": 400.0, "why": "trigger", "slowed": [1]}
    stub.value = np.ones(4)  # the slowdown ends at once ...
    for t in (410.0, 450.0, 600.0):
        step(t)
    assert len(ctl.splits) == 2  # ... but the cooldown (until 700 s) holds the split
    step(720.0)
    assert ctl.splits[-1]["why"] == "trigger" and ctl.splits[-1]["slowed"] == []
    assert int(batches.sum()) == ctl.target_global_batch


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"threshold": 1.0}, "threshold must be > 1"),
        ({"sustain_s": -1.0}, "sustain_s must be >= 0"),
        ({"cooldown_s": float("nan")}, "cooldown_s must be >= 0"),
        ({"plan_intervals": 0}, "plan_intervals must be an integer >= 1"),
        ({"global_fraction": 1.5}, "global_fraction must be in"),
    ],
)
def test_bad_parameters_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DynPipeDPController(**kwargs)


def test_registry_and_config_build_it(tmp_path):
    assert make_controller("dynpipe_dp").name == "dynpipe_dp"
    cfg = OmegaConf.load(ROOT / "conf" / "controller" / "dynpipe_dp.yaml")
    assert isinstance(instantiate(cfg), DynPipeDPController)
    with pytest.raises(FileNotFoundError, match=r"fit one with python -m experiments\.fit_interference"):
        DynPipeDPController(model_dir=tmp_path)
