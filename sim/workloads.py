"""Workloads: which model trains on which data, and which measured profiles describe it.

A workload names the measured application (``app``) whose compute and communication fits apply,
and the convergence model fitted for it. A workload without its own measurements (ResNet-34 on
CIFAR-100) borrows a measured one's profiles, scaled by its FLOP and gradient-size ratios.
Parameter counts and FLOPs are properties of the architectures (torchvision / the papers), not
fitted quantities.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.validation import check_choice, check_int, check_positive, check_range


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # human-readable model / dataset
    app: str  # measured application whose compute / comm models apply
    convergence: str  # key in sim/data/convergence_models.json
    params_millions: float  # trainable parameters; gradient bytes = 4 * params (fp32 all-reduce)
    app_params_millions: float  # parameters of the measured application's model
    samples_per_epoch: int
    target_accuracy: float  # validation accuracy (fraction) that ends an episode
    num_classes: int
    val_samples: int  # validation-set size: sets the measurement noise of validation accuracy
    sample_bytes: float = 32 * 32 * 3 * 4  # one decoded input sample (float32 tensor)
    lr_rule: str = "adascale"
    flops_scale: float = 1.0  # GPU work per sample relative to the measured application's model
    initial_local_batch: int = 128
    time_budget_s: float = 4 * 3600.0

    def __post_init__(self) -> None:
        check_positive(f"workload {self.name}.params_millions", self.params_millions)
        check_positive(f"workload {self.name}.app_params_millions", self.app_params_millions)
        check_int(f"workload {self.name}.samples_per_epoch", self.samples_per_epoch, 1)
        check_range(f"workload {self.name}.target_accuracy", self.target_accuracy, 0.0, 1.0, low_open=True)
        check_int(f"workload {self.name}.num_classes", self.num_classes, 2)
        check_int(f"workload {self.name}.val_samples", self.val_samples, 1)
        check_choice(f"workload {self.name}.lr_rule", self.lr_rule, ("adascale", "linear", "sqrt", "none"))
        check_positive(f"workload {self.name}.flops_scale", self.flops_scale)
        check_int(f"workload {self.name}.initial_local_batch", self.initial_local_batch, 1)
        check_positive(f"workload {self.name}.time_budget_s", self.time_budget_s)

    @property
    def model_bytes(self) -> float:
        return 4.0e6 * self.params_millions

    @property
    def comm_scale(self) -> float:
        """All-reduce time relative to the measured application's (gradient-size ratio)."""
        return self.params_millions / self.app_params_millions


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            name="cifar10",
            model="ResNet-18 / CIFAR-10 (fp32, AdaScale)",
            app="cifar10",
            convergence="cifar10",
            params_millions=11.17,
            app_params_millions=11.17,
            samples_per_epoch=50_000,
            target_accuracy=0.93,
            num_classes=10,
            val_samples=10_000,
            initial_local_batch=128,
            time_budget_s=3600.0,
        ),
        Workload(
            name="imagenet",
            model="ResNet-50 / ImageNet (AMP, AdaScale)",
            app="imagenet",
            convergence="imagenet",
            params_millions=25.56,
            app_params_millions=25.56,
            samples_per_epoch=1_281_167,
            target_accuracy=0.74,
            num_classes=1000,
            val_samples=50_000,
            sample_bytes=224 * 224 * 3 * 4,
            initial_local_batch=64,
            time_budget_s=48 * 3600.0,
        ),
        Workload(
            name="cifar100_resnet34",
            model="ResNet-34 / CIFAR-100 (fp32, no learning-rate scaling)",
            app="cifar10",
            convergence="cifar100_resnet34",
            params_millions=21.33,
            app_params_millions=11.17,
            samples_per_epoch=50_000,
            target_accuracy=0.76,
            num_classes=100,
            val_samples=10_000,
            lr_rule="none",
            # ResNet-34 vs ResNet-18 on 32x32 inputs: 1.16 vs 0.56 GFLOPs per forward pass.
            flops_scale=1.16 / 0.56,
            initial_local_batch=64,
            time_budget_s=5 * 3600.0,
        ),
        Workload(
            name="ncf",
            model="NeuMF / MovieLens-1M (fp32, Adam, AdaScale)",
            app="ncf",
            convergence="ncf",
            # AdaptDL's examples/NCF: NeuMF-end, 32 factors, 3 MLP layers, 6040 users, 3706 items:
            # embeddings 9746 * (32 + 128), MLP 256-128-64-32, predict 64-1.
            params_millions=1.602657,
            app_params_millions=1.602657,
            samples_per_epoch=4_970_845,  # 994,169 training ratings, each with 4 sampled negatives
            target_accuracy=0.68,  # HR@10 among 1 held-out item + 99 negatives
            num_classes=2,  # implicit-feedback labels (clicked or not); HR's chance is in the model
            val_samples=6_040,  # one held-out item per user
            sample_bytes=8 + 8 + 4,  # user id, item id (int64), label (float32)
            initial_local_batch=256,
            time_budget_s=3600.0,
        ),
    ]
}


def get_workload(name: str | Workload, **overrides) -> Workload:
    """A preset by name (optionally with fields overridden), or the given workload unchanged."""
    if isinstance(name, Workload):
        return replace(name, **overrides) if overrides else name
    check_choice("workload", name, WORKLOADS)
    return replace(WORKLOADS[name], **overrides) if overrides else WORKLOADS[name]
