"""GPU check: the real backend's end-to-end path on one GPU.

    python -m adapters.gpu_check          # exits 0 with "SKIP: ..." when there is no CUDA device

Two gloo ranks share the one GPU (NCCL refuses two ranks on one device) and train ResNet-18
(GroupNorm) on generated CIFAR-shaped data, emulating a T4 beside a V100, driven by the DLB
baseline through ``dynamix/RealDDP-v0`` and ``run_episode``, as ``experiments.deploy`` does. It
also checks the uneven-batch gradient against one process's on the GPU. Prints the summary row.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch


def gradient_check() -> float:
    """Largest relative difference between the 2-rank uneven-batch gradient and one process's."""
    import torch.nn.functional as F

    from adapters.data import load_dataset
    from adapters.ddp_backend import DDPBackend
    from adapters.models import build_model

    batches = [24, 72]
    backend = DDPBackend(workers=2, device="cuda", model="resnet18", dataset="cifar_synthetic")
    try:
        backend.reset(seed=0)
        out = backend.gradient(batches)
    finally:
        backend.close()
    data = load_dataset("cifar_synthetic")
    model = build_model("resnet18", data.input_shape, data.num_classes).cuda()
    model.load_state_dict(out[0]["state"])
    idx = torch.from_numpy(out[0]["indices"])
    F.cross_entropy(model(data.x_train[idx].cuda()), data.y_train[idx].cuda()).backward()
    single = torch.cat([p.grad.flatten() for p in model.parameters()]).cpu().numpy()
    return float(np.max(np.abs(out[0]["gradient"] - single)) / np.max(np.abs(single)))


def main() -> int:
    if not torch.cuda.is_available():
        print(
            "SKIP: no CUDA device here; the GPU check needs one (the CPU tests cover the same path with gloo)."
        )
        return 0
    from adapters.ddp_env import make_real_ddp_env
    from dynamix_gym.controllers.registry import make_controller
    from dynamix_gym.evaluation import SUMMARY_COLUMNS, run_episode

    print(f"device: {torch.cuda.get_device_name(0)}")
    t0 = time.perf_counter()
    err = gradient_check()
    print(f"uneven-batch gradient vs one process: max relative difference {err:.2e}")
    env = make_real_ddp_env(
        workers=2,
        device="cuda",
        dist_backend="gloo",
        model="resnet18",
        dataset="cifar_synthetic",
        emulate=("T4", "V100"),
        base_batch=64,
        min_batch=16,
        max_batch=512,
        initial_batch=64,
        base_lr=0.05,
        target_accuracy=0.9,
        interval=20,
        max_decisions=8,
    )
    try:
        result = run_episode(env, make_controller("dlb"), seed=0, scenario="static_hetero")
        report = env.unwrapped.last_report
    finally:
        env.close()
    print(",".join(SUMMARY_COLUMNS))
    print(",".join(str(result.summary[c]) for c in SUMMARY_COLUMNS))
    print(f"last local batches {report.local_batch.tolist()}, gpu_mem_util {report.gpu_mem_util.tolist()}")
    ok = err < 1e-3 and result.summary["decisions"] > 0 and float(report.gpu_mem_util.max()) > 0
    print(f"{'PASS' if ok else 'FAIL'} in {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
