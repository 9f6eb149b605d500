"""The language-model task without worker processes: the standard-library corpus, its data set, the
byte transformer, the task's loss / count / validation and the config's checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adapters.config import RealDDPConfig
from adapters.corpus import CONTEXT, CORPUS_BYTES, FILE_BYTES, stdlib_corpus, windows
from adapters.data import load_dataset
from adapters.ddp_backend import DDPBackend
from adapters.models import build_model
from adapters.tasks import CLASSIFICATION, LM_METRIC, NEXT_BYTE, task_of, unreachable_target
from sim.workloads import ACCURACY


@pytest.fixture(scope="module")
def lm_data():
    return load_dataset("pystdlib", val_fraction=0.05, split_seed=0)


def _fake_stdlib(root, sizes: dict[str, int]) -> None:
    for name, n in sizes.items():
        (root / name).write_bytes(bytes([ord("a") + len(name) % 26]) * n)


def test_corpus_selection_is_sorted_public_modules_capped_per_file_and_in_total(tmp_path):
    _fake_stdlib(tmp_path, {"b.py": 50, "a.py": 30, "_private.py": 500, "c.py": 100, "notes.txt": 500})
    (tmp_path / "sub").mkdir()
    _fake_stdlib(tmp_path / "sub", {"z.py": 500})
    c = stdlib_corpus(tmp_path, budget_bytes=100, file_bytes=40)
    assert c.files == (("a.py", 30), ("b.py", 40), ("c.py", 30))
    assert c.data.size == 100
    assert c.data[:30].tobytes() == (tmp_path / "a.py").read_bytes()
    with pytest.raises(ValueError, match=r"holds 110 bytes of public modules .* needs 200"):
        stdlib_corpus(tmp_path, budget_bytes=200, file_bytes=40)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stdlib_corpus(tmp_path / "absent")


def test_the_standard_library_corpus_is_deterministic_and_recorded():
    a, b = stdlib_corpus(), stdlib_corpus()
    assert a.sha256 == b.sha256 and a.data.size == CORPUS_BYTES
    meta = a.meta()
    names = [f for f, _ in meta["files"]]
    assert names == sorted(names) and not any(n.startswith("_") for n in names)
    assert sum(n for _, n in meta["files"]) == CORPUS_BYTES
    assert all(0 < n <= FILE_BYTES for _, n in meta["files"])
    assert meta["python"].count(".") == 2 and len(meta["sha256"]) == 64


def test_windows_overlap_by_one_byte():
    data = np.arange(200, dtype=np.uint8)
    w = windows(data, context=64)
    assert w.shape == (3, 65) and w.dtype == np.int64
    assert w[1, 0] == w[0, -1] == 64
    with pytest.raises(ValueError, match="no window"):
        windows(np.zeros(10, dtype=np.uint8), context=64)


def test_pystdlib_split_follows_val_fraction_and_split_seed(lm_data):
    n = (CORPUS_BYTES - 1) // CONTEXT
    assert lm_data.x_val.shape == (round(0.05 * n), CONTEXT)
    assert lm_data.train_size + lm_data.x_val.shape[0] == n
    assert lm_data.num_classes == 256 and lm_data.input_shape == (CONTEXT,)
    assert torch.equal(lm_data.x_train[:, 1:], lm_data.y_train[:, :-1])  # y is x one byte on
    assert lm_data.meta["windows"] == n and lm_data.meta["val_windows"] == lm_data.x_val.shape[0]
    other = load_dataset("pystdlib", val_fraction=0.05, split_seed=1)
    assert not torch.equal(other.x_val, lm_data.x_val)
    assert torch.equal(load_dataset("pystdlib", val_fraction=0.05, split_seed=0).x_val, lm_data.x_val)


def test_byte_transformer_is_causal_and_a_few_hundred_thousand_parameters():
    torch.manual_seed(0)
    model = build_model("transformer", (CONTEXT,), 256).eval()
    assert sum(p.numel() for p in model.parameters()) == 279_424
    x = torch.randint(256, (2, CONTEXT))
    y = x.clone()
    y[:, 40:] = (y[:, 40:] + 1) % 256  # change the future from position 40 on
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, CONTEXT, 256)
    torch.testing.assert_close(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])
    with pytest.raises(ValueError, match=r"reads byte sequences"):
        build_model("transformer", (1, 8, 8), 256)
    with pytest.raises(ValueError, match=r"reads images"):
        build_model("cnn", (CONTEXT,), 10)


def test_next_byte_loss_count_and_validation_use_the_falling_metric(lm_data):
    torch.manual_seed(0)
    model = build_model("transformer", lm_data.input_shape, lm_data.num_classes).eval()
    x, y = lm_data.x_train[:8], lm_data.y_train[:8]
    with torch.no_grad():
        out = model(x)
        loss = NEXT_BYTE.loss_sum(out, y)
    per_window = [float(F.cross_entropy(out[i], y[i])) for i in range(8)]
    assert float(loss) == pytest.approx(sum(per_window), rel=1e-5)
    assert float(NEXT_BYTE.count(out, y, loss)) == pytest.approx(8 - 0.1 * float(loss))
    quality, val_loss = NEXT_BYTE.validate(model, lm_data.x_val, lm_data.y_val, chunk=100)
    assert abs(val_loss - math.log(256)) < 0.5  # an untrained model predicts about uniformly
    assert quality == pytest.approx(1 - 0.1 * val_loss)
    assert LM_METRIC.from_quality(quality) == pytest.approx(val_loss)
    assert NEXT_BYTE.diverged(val_loss, [val_loss]) is None
    assert "beyond the val_loss metric's range [0, 10]" in NEXT_BYTE.diverged(12.0, [3.0])
    assert CLASSIFICATION.diverged(1e9, [1e9]) is None  # accuracy has no such range


def test_tasks_by_dataset():
    assert task_of("digits") is CLASSIFICATION and task_of("pystdlib") is NEXT_BYTE
    assert CLASSIFICATION.metric is ACCURACY and NEXT_BYTE.metric is LM_METRIC
    assert unreachable_target("mnist") == {"target_accuracy": 1.0}
    assert unreachable_target("pystdlib") == {"target_val_loss": 0.0}
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        task_of("imagenet")


def test_lm_config_target_is_a_falling_val_loss():
    cfg = RealDDPConfig(dataset="pystdlib", model="transformer", target_val_loss=2.5)
    assert cfg.task is NEXT_BYTE and cfg.target == 2.5 and cfg.target_quality == pytest.approx(0.75)
    assert RealDDPConfig(dataset="pystdlib", model="transformer").target == NEXT_BYTE.default_target
    spec = DDPBackend(cfg).spec  # no process before reset
    assert spec.metric is LM_METRIC and spec.num_classes == 256 and spec.workload == "transformer/pystdlib"
    assert spec.target_accuracy == pytest.approx(0.75)
    digits = DDPBackend(RealDDPConfig(target_accuracy=0.9)).spec
    assert digits.metric is ACCURACY and digits.target_accuracy == 0.9 and digits.num_classes == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "pystdlib", "model": "cnn"}, r"model='cnn' does not fit dataset='pystdlib' .*\['transformer'\]"),
        ({"dataset": "digits", "model": "transformer"}, r"model='transformer' does not fit dataset='digits'"),
        ({"dataset": "digits", "target_val_loss": 2.0}, r"target_val_loss applies to .* target_accuracy"),
        ({"dataset": "pystdlib", "model": "transformer", "target_val_loss": 6.0}, r"target_val_loss must be in \[0, 5.5452\)"),
        ({"dataset": "pystdlib", "model": "transformer", "target_val_loss": -0.1}, r"target_val_loss must be in"),
        ({"dataset": "pystdlib", "model": "transformer", "target_val_loss": "2"}, r"target_val_loss must be in"),
        ({"dataset": "pystdlib", "model": "transformer", "val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
        ({"dataset": "wikitext"}, r"dataset='wikitext' is not one of"),
    ],
)  # fmt: skip
def test_bad_lm_config_values_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RealDDPConfig(**kwargs)


def test_the_calibrated_workload_of_the_lm_carries_its_falling_metric():
    from omegaconf import OmegaConf

    from experiments.calibration.real import real_workload

    cfg = OmegaConf.create({"workload": {"name": "pystdlib_lm"}})
    real = {"dataset": "pystdlib", "model": "transformer", "val_fraction": 0.05, "target_val_loss": 2.3}
    wl = real_workload(cfg, real, train_size=7781)
    assert wl.metric == LM_METRIC and wl.target_accuracy == 2.3 and wl.target_quality == pytest.approx(0.77)
    assert wl.chance_quality == pytest.approx(1 - 0.1 * math.log(256))
    assert wl.num_classes == 256 and wl.val_samples == 410 * CONTEXT and wl.sample_bytes == 8 * CONTEXT
    assert wl.params_millions == pytest.approx(0.279424)
    cnn = real_workload(cfg, {"dataset": "digits", "model": "cnn"}, train_size=1438)
    assert cnn.metric is ACCURACY and cnn.target_accuracy == 0.95 and cnn.chance_quality == 0.1
    assert cnn.sample_bytes == 4 * 64 and cnn.val_samples == 359  # digits: 20 % of 1,797 images


def _compose(app: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from support import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(app, overrides=overrides)


def test_the_deploy_app_trains_the_lm_by_a_config_choice():
    from experiments.evaluate import make_env

    env = make_env(_compose("deploy", ["real_task=lm"]), "delta")
    try:
        backend = env.unwrapped.backend
        assert backend.config.dataset == "pystdlib" and backend.config.model == "transformer"
        assert backend.spec.metric is LM_METRIC and backend.spec.target_accuracy == pytest.approx(0.77)
        assert backend.worker_pids == []  # no process before reset
    finally:
        env.close()
    default = make_env(_compose("deploy", []), "delta")
    try:  # the default task is still the CNN on MNIST
        assert default.unwrapped.backend.config.dataset == "mnist"
        assert default.unwrapped.backend.spec.target_accuracy == 0.96
    finally:
        default.close()


def test_the_calibrate_and_fidelity_presets_of_the_lm_compose():
    cal = _compose("calibrate", ["+calibrate_preset=lm"])
    RealDDPConfig(**{**cal.real})  # the profiled backend is a valid config
    assert cal.real.dataset == "pystdlib" and cal.out_dir == "results/lm/profile"
    fid = _compose("fidelity", ["+fidelity_preset=lm"])
    assert fid.profile == cal.out_dir
    cnn = _compose("fidelity", ["+fidelity_preset=deploy_cnn_cost_ep"])  # CNN 16's campaign
    assert cnn.finetune == [] and [c.get("label") for c in cnn.controllers][2:] == [
        "universal-cost",
        "universal-cost-ep",
    ]
    ep = _compose("fidelity", ["+fidelity_preset=deploy_lm_cost_ep"])  # LM 18's campaign
    assert ep.finetune == [] and [c.get("label") for c in ep.controllers][2:] == [
        "universal-cost",
        "universal-cost-ep",
    ]


def test_the_committed_lm_profile_runs_in_the_simulator_to_its_falling_target():
    from support import ROOT

    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from sim.profile import load_profile

    profile = load_profile(ROOT / "results" / "lm" / "profile")
    assert profile.workload.metric == LM_METRIC and profile.workload.target_accuracy == 2.3
    env = HeteroClusterEnv(profile=profile, action_mode="absolute", interval=20, time_budget_s=600)
    env.reset(seed=0)
    for _ in range(100):
        _, _, terminated, truncated, info = env.step(np.array([16.0, 16.0], dtype=np.float32))
        if terminated or truncated:
            break
    assert terminated, info["report"].val_accuracy
    assert LM_METRIC.from_quality(info["report"].val_accuracy) <= 2.3
