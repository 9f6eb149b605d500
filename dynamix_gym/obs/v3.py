"""Observation schema 3: schema 2 plus the job's learning-rate regime.

Schema 2 (:mod:`dynamix_gym.obs.v2`) cannot tell the two regimes of the convergence model
apart until their progress differs: with the learning rate scaled to the batch (AdaScale, linear,
sqrt) a larger batch costs only statistical efficiency, while without scaling (``lr_rule: none``,
ResNet-34 / CIFAR-100 in the benchmark) it lowers the accuracy the run can reach, so that the
same growth that is right for CIFAR-10 misses CIFAR-100's target. Whether a job scales its
learning rate, and the batch its learning rate was tuned for, are facts the job states when it
starts (:attr:`sim.protocol.BackendSpec.lr_rule` and ``base_batch``; the real backend, the
torchrun drop-in and the arbitrator's registration carry both), so schema 3 reads them as two
global features after schema 2's (``global.lr_scaled``, ``global.batch_to_base``). Both are
relative to the job's own scale (the second to its own base batch), so the schema stays scale-free.

Per-worker observation (``self.*`` then ``global.*``; :data:`OBS_SCHEMA_V3`; rows 0-28 are schema
2's):

| index | name | unit | raw range | description |
|---|---|---|---|---|
| 0 | self.batch_position | fraction | [0, 1] | (log2 b - log2 min) / (log2 max - log2 min); 0 if min = max |
| 1 | self.batch_ratio | log2(ratio) | [-6, 6] | local batch / mean live local batch |
| 2 | self.speed_ratio | log2(ratio) | [-6, 6] | compute samples/s / mean over live workers |
| 3 | self.speed_trend | log2(ratio) | [-4, 4] | compute samples/s / its value in the worker's first live interval |
| 4 | self.compute_share | fraction | [0, 1] | compute time / slowest live worker's compute time |
| 5 | self.idle_fraction | fraction | [0, 1] | share of the iteration spent waiting at the barrier |
| 6 | self.gpu_util | fraction | [0, 1] | device busy fraction |
| 7 | self.cpu_util_change | fraction | [-1, 1] | host CPU utilisation minus its value in the worker's first live interval |
| 8 | self.net_share | log2(ratio) | [-6, 6] | gradient bytes/s sent / mean over live workers |
| 9 | self.retransmit_rate | log10(fraction) | [-6, 0] | retransmitted / sent TCP segments (1448-byte segments), floored at 1e-6 |
| 10 | self.grad_norm_ratio | log2(ratio) | [-4, 4] | mean local gradient norm / mean over live workers |
| 11 | self.grad_norm_cv | log10(ratio) | [-4, 1] | std / mean of the local gradient norm, floored at 1e-6 |
| 12 | self.grad_norm_trend | log2(ratio) | [-6, 6] | mean local gradient norm / its value in the worker's first live interval |
| 13 | self.alive | flag | [0, 1] | 1 if the worker took part in the interval |
| 14 | global.progress | fraction | [-0.5, 1.5] | (quality - first quality) / (target - first quality) |
| 15 | global.progress_gain | fraction | [-0.5, 0.5] | quality gain over `window` intervals / (target - first quality) |
| 16 | global.val_loss_trend | log2(ratio) | [-8, 2] | validation loss / first interval's |
| 17 | global.noise_to_batch | log2(ratio) | [-12, 12] | noise-scale estimate / global batch |
| 18 | global.noise_scale_trend | log2(ratio) | [-8, 8] | noise-scale estimate / the run's first unsaturated estimate |
| 19 | global.global_batch_position | fraction | [0, 1] | global batch in octaves between the live workers' summed min and max |
| 20 | global.time_used | fraction | [0, 1.5] | wall time / episode time budget |
| 21 | global.interval_time_trend | log2(ratio) | [-8, 8] | interval wall time / the run's first interval's |
| 22 | global.iteration_time_trend | log2(ratio) | [-6, 6] | mean live iteration time / the run's first interval's |
| 23 | global.throughput_trend | log2(ratio) | [-6, 6] | samples/s of the interval / the run's first interval's |
| 24 | global.throughput_gain | log2(ratio) | [-4, 4] | samples/s / its value `window` intervals ago |
| 25 | global.comm_fraction | fraction | [0, 1] | exposed all-reduce / mean live iteration time |
| 26 | global.mean_idle_fraction | fraction | [0, 1] | idle fraction averaged over live workers |
| 27 | global.reconfig_fraction | fraction | [0, 1] | batch-change (reconfiguration) time / interval wall time |
| 28 | global.live_fraction | fraction | [0, 1] | live workers / workers |
| 29 | global.lr_scaled | flag | [0, 1] | 1 if the job scales its learning rate with the batch (adascale, linear, sqrt), 0 if not |
| 30 | global.batch_to_base | log2(ratio) | [-6, 10] | global batch / the batch the learning rate was tuned for (base_batch) |
"""

from __future__ import annotations

import math

from dynamix_gym.obs.base import Feature, ObservationSchema
from dynamix_gym.obs.v2 import GLOBAL_FEATURES_V2, WORKER_FEATURES_V2, ScaleFreeEncoder
from sim.protocol import BackendSpec

SCHEMA_VERSION_V3 = "3"

REGIME_FEATURES: tuple[Feature, ...] = (
    Feature(
        "lr_scaled",
        "flag",
        0.0,
        1.0,
        "1 if the job scales its learning rate with the batch (adascale, linear, sqrt), 0 if not",
    ),
    Feature(
        "batch_to_base",
        "log2(ratio)",
        -6.0,
        10.0,
        "global batch / the batch the learning rate was tuned for (base_batch)",
    ),
)

OBS_SCHEMA_V3 = ObservationSchema(SCHEMA_VERSION_V3, WORKER_FEATURES_V2, GLOBAL_FEATURES_V2 + REGIME_FEATURES)


class RegimeAwareEncoder(ScaleFreeEncoder):
    """Observation schema 3 (:data:`OBS_SCHEMA_V3`): schema 2's encoder plus the regime features.

    Args: as :class:`~dynamix_gym.obs.v2.ScaleFreeEncoder`.
    """

    schema = OBS_SCHEMA_V3

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        self._lr_scaled = 0.0 if spec.lr_rule == "none" else 1.0
        self._log2_base = math.log2(max(int(spec.base_batch), 1))
        super().__init__(spec, window, noise_smoothing)

    def _extra_globals(self, global_batch: int) -> tuple[float, ...]:
        return (self._lr_scaled, math.log2(max(global_batch, 1)) - self._log2_base)
