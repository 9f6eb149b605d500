"""Workloads: which model trains on which data, and which measured profiles describe it.

A workload names the measured application (``app``) whose compute and communication fits apply,
and the convergence model fitted for it. A workload without its own measurements (ResNet-34 on
CIFAR-100) borrows a measured one's profiles, scaled by its FLOP and gradient-size ratios.
Parameter counts and FLOPs are properties of the architectures (torchvision / the papers), not
fitted quantities.

The simulator and the env work in one internal quality, a fraction in [0, 1] that rises as the
model trains (the convergence model's "accuracy"). A workload's :class:`QualityMetric` maps its
validation metric, in the metric's own units, to and from it:

    fraction = value * scale                                   # e.g. F1 or WER in percent: 0.01
    quality  = fraction if higher_is_better else 1 - fraction  # WER 12 % -> quality 0.88

so a falling metric (WER, a loss scaled to [0, 1]) needs no special case in the reward, the
observation or the episode's end, and tables show the metric in its own name and units. The
shipped accuracy metrics have scale 1 and rise: their quality is the value itself, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.validation import check_choice, check_int, check_positive, check_range


@dataclass(frozen=True)
class QualityMetric:
    """A validation metric and its map to the internal quality (see the module docstring)."""

    name: str = "accuracy"
    higher_is_better: bool = True
    scale: float = 1.0  # multiplies a value in the metric's units into a fraction in [0, 1]
    untrained: float | None = None  # value of an untrained model, metric units (None: not given)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"metric.name must be a non-empty name, got {self.name!r}")
        if not isinstance(self.higher_is_better, bool):
            raise ValueError(f"metric.higher_is_better must be true or false, got {self.higher_is_better!r}")
        check_positive("metric.scale", self.scale)
        if self.untrained is not None:
            self.check_value(f"metric.untrained ({self.name})", self.untrained)

    @property
    def value_range(self) -> tuple[float, float]:
        """The values (metric units) whose fraction lies in [0, 1]."""
        return 0.0, 1.0 / self.scale

    def check_value(self, field: str, value: float) -> float:
        """``value`` if its fraction lies in [0, 1], else a ValueError naming ``field`` and the range."""
        lo, hi = self.value_range
        return check_range(field, value, lo, hi)

    def to_quality(self, value):
        """Quality (rising fraction) of a metric value; numpy arrays map element-wise."""
        if self.scale == 1.0 and self.higher_is_better:
            return value  # the shipped accuracies: the value itself
        fraction = value * self.scale
        return fraction if self.higher_is_better else 1.0 - fraction

    def from_quality(self, quality):
        """The metric value (its own units) of a quality; the inverse of :meth:`to_quality`."""
        if self.scale == 1.0 and self.higher_is_better:
            return quality
        fraction = quality if self.higher_is_better else 1.0 - quality
        return fraction / self.scale


ACCURACY = QualityMetric()


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # human-readable model / dataset
    app: str  # measured application whose compute / comm models apply
    convergence: str  # key in sim/data/convergence_models.json
    params_millions: float  # trainable parameters; gradient bytes = 4 * params (fp32 all-reduce)
    app_params_millions: float  # parameters of the measured application's model
    samples_per_epoch: int
    target_accuracy: float  # value of the validation metric (its own units) that ends an episode
    num_classes: int
    val_samples: int  # validation-set size: sets the measurement noise of validation accuracy
    sample_bytes: float = 32 * 32 * 3 * 4  # one decoded input sample (float32 tensor)
    lr_rule: str = "adascale"
    flops_scale: float = 1.0  # GPU work per sample relative to the measured application's model
    initial_local_batch: int = 128
    time_budget_s: float = 4 * 3600.0
    #: smallest local batch a worker may run; None: DEFAULT_MIN_LOCAL_BATCH, lowered to the smallest
    #: memory cap of the cluster's workers (see :func:`min_local_batch`)
    min_local_batch: int | None = None
    #: the validation metric and its map to the internal quality; the default is accuracy (a
    #: rising fraction), the shipped presets' metric
    metric: QualityMetric = ACCURACY

    def __post_init__(self) -> None:
        check_positive(f"workload {self.name}.params_millions", self.params_millions)
        check_positive(f"workload {self.name}.app_params_millions", self.app_params_millions)
        check_int(f"workload {self.name}.samples_per_epoch", self.samples_per_epoch, 1)
        if not isinstance(self.metric, QualityMetric):
            raise ValueError(f"workload {self.name}.metric must be a QualityMetric, got {self.metric!r}")
        m = self.metric
        lo, hi = m.value_range
        check_range(
            f"workload {self.name}.target_accuracy ({m.name}, higher is {'better' if m.higher_is_better else 'worse'})",
            self.target_accuracy, lo, hi, low_open=m.higher_is_better, high_open=not m.higher_is_better,
        )  # fmt: skip
        if m.untrained is not None and m.to_quality(m.untrained) >= self.target_quality:
            raise ValueError(
                f"workload {self.name}: the target {m.name} {self.target_accuracy!r} must be better than an "
                f"untrained model's ({m.untrained!r}; higher is {'better' if m.higher_is_better else 'worse'})"
            )
        check_int(f"workload {self.name}.num_classes", self.num_classes, 2)
        check_int(f"workload {self.name}.val_samples", self.val_samples, 1)
        check_choice(f"workload {self.name}.lr_rule", self.lr_rule, ("adascale", "linear", "sqrt", "none"))
        check_positive(f"workload {self.name}.flops_scale", self.flops_scale)
        check_int(f"workload {self.name}.initial_local_batch", self.initial_local_batch, 1)
        check_positive(f"workload {self.name}.time_budget_s", self.time_budget_s)
        if self.min_local_batch is not None:
            check_int(f"workload {self.name}.min_local_batch", self.min_local_batch, 1)

    @property
    def target_quality(self) -> float:
        """The target as the internal quality (a rising fraction in (0, 1]): what ends an episode."""
        return float(self.metric.to_quality(self.target_accuracy))

    @property
    def chance_quality(self) -> float:
        """The quality of an untrained model: the metric's ``untrained`` value as a quality, else a
        uniform guess among ``num_classes`` (the convergence model's starting point)."""
        m = self.metric
        return float(m.to_quality(m.untrained)) if m.untrained is not None else 1.0 / self.num_classes

    @property
    def model_bytes(self) -> float:
        return 4.0e6 * self.params_millions

    @property
    def comm_scale(self) -> float:
        """All-reduce time relative to the measured application's (gradient-size ratio)."""
        return self.params_millions / self.app_params_millions


#: Smallest local batch of a workload that does not name its own, where every worker's memory cap
#: allows it (else the smallest cap): the lower end of the batch ranges the controllers search.
DEFAULT_MIN_LOCAL_BATCH = 16


def min_local_batch(workload: Workload, max_batches) -> int:
    """The workload's ``min_local_batch``, else ``min(DEFAULT_MIN_LOCAL_BATCH, smallest cap)``.

    ``max_batches``: the memory caps (largest local batch) of the cluster's workers.
    """
    if workload.min_local_batch is not None:
        return workload.min_local_batch
    return int(min(DEFAULT_MIN_LOCAL_BATCH, *(int(b) for b in max_batches)))


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
            metric=QualityMetric("top1_accuracy", untrained=0.1),  # a guess among 10 classes
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
            metric=QualityMetric("top1_accuracy", untrained=0.001),  # a guess among 1000 classes
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
            metric=QualityMetric("top1_accuracy", untrained=0.01),  # a guess among 100 classes
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
            metric=QualityMetric("hr_at_10", untrained=0.1),  # a random ranking of 1 + 99 items
        ),
        Workload(
            name="bert",
            model="BERT-base / SQuAD v1.1 fine-tune (fp32, AdaScale)",
            app="bert",
            convergence="bert",
            # BertForQuestionAnswering on bert-base-uncased: the encoder without its pooler
            # (108,891,648) and the 768 -> 2 span head (1,538).
            params_millions=108.893186,
            app_params_millions=108.893186,
            # SQuAD v1.1's 87,599 training questions as 384-token features with a 128-token doc
            # stride; the traces' 7,387 steps per epoch at batch 12 agree (ceil(88,641 / 12)).
            samples_per_epoch=88_641,
            target_accuracy=88.0,  # F1 (percent) on the dev set; BERT-base reports 88.5
            num_classes=384,  # the span start (and end) is one of the 384 token positions
            val_samples=10_570,  # SQuAD v1.1 dev questions
            sample_bytes=384 * 3 * 8 + 2 * 8,  # input ids, token types, mask (int64); start, end
            initial_local_batch=12,
            time_budget_s=4 * 3600.0,
            # The smallest local batch measured on every GPU type (throughput_profiles.csv); the
            # T4 and RTX2080Ti caps are 12, below DEFAULT_MIN_LOCAL_BATCH.
            min_local_batch=4,
            # SQuAD F1 in percent, as in the traces; an untrained span predictor scores ~ 0.
            metric=QualityMetric("f1", scale=0.01, untrained=0.0),
        ),
    ]
}


def get_workload(name: str | Workload, **overrides) -> Workload:
    """A preset by name (optionally with fields overridden), or the given workload unchanged."""
    if isinstance(name, Workload):
        return replace(name, **overrides) if overrides else name
    check_choice("workload", name, WORKLOADS)
    return replace(WORKLOADS[name], **overrides) if overrides else WORKLOADS[name]
