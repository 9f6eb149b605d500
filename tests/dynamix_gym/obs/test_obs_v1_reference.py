"""The fast observation encoder, noise estimator and reward against a plain reference.

The production code is written for speed (few, wide numpy calls; its cost is benchmarked in
``experiments.bench_env``). The reference below computes every feature one worker at a time in
plain Python, straight from the schema's descriptions, so the two share no code and a shortcut in
the fast path that changes a value cannot go unnoticed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dynamix_gym import OBS_SCHEMA, HeteroClusterEnv
from dynamix_gym.obs import ObservationEncoder
from dynamix_gym.reward import RewardConfig, compute_reward
from dynamix_gym.stats import MAX_NOISE_SCALE, NoiseScaleEstimator, two_batch_estimates

W_FEATURES, G_FEATURES = OBS_SCHEMA.worker_features, OBS_SCHEMA.global_features


def _norm(value: float, feature) -> float:
    clipped = min(max(value, feature.low), feature.high)
    return 2.0 * (clipped - feature.low) / (feature.high - feature.low) - 1.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def reference_two_batch(report) -> tuple[float, float] | None:
    """Ordinary weighted least squares of |g_B|^2 on 1/B: local points weigh 1, the global n."""
    pts = [
        (1.0 / float(report.local_batch[i]), float(report.local_grad_sqr[i]), 1.0)
        for i in range(report.local_batch.size)
        if report.alive[i]
    ]
    n = len(pts)
    if n == 0 or report.global_batch <= 0:
        return None
    pts.append((1.0 / report.global_batch, float(report.global_grad_sqr), float(n)))
    w = sum(p[2] for p in pts)
    xm = sum(p[0] * p[2] for p in pts) / w
    ym = sum(p[1] * p[2] for p in pts) / w
    sxx = sum(p[2] * (p[0] - xm) ** 2 for p in pts)
    if sxx <= 1e-12 * max(xm * xm, 1e-300):
        return None
    sxy = sum(p[2] * (p[0] - xm) * (p[1] - ym) for p in pts)
    return ym - sxy / sxx * xm, sxy / sxx


class ReferenceNoise:
    """The smoothed two-batch noise-scale estimate, as the schemas' reference encoders read it."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.g2 = self.sigma = None

    def noise_scale(self) -> float | None:
        if self.g2 is None:
            return None
        if self.sigma <= 0:
            return 1.0
        if self.g2 <= self.sigma / MAX_NOISE_SCALE:
            return MAX_NOISE_SCALE
        return self.sigma / self.g2

    def absorb(self, r) -> None:
        est = reference_two_batch(r)
        if est is not None:
            if self.g2 is None:
                self.g2, self.sigma = est
            else:
                self.g2 += self.smoothing * (est[0] - self.g2)
                self.sigma += self.smoothing * (est[1] - self.sigma)


class ReferenceEncoder(ReferenceNoise):
    def __init__(self, spec, window: int = 4, smoothing: float = 0.2) -> None:
        super().__init__(smoothing)
        self.spec, self.window = spec, window
        self.batch_acc: list[np.ndarray] = []
        self.val_acc: list[float] = []

    def update(self, r) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        self.absorb(r)
        self.batch_acc = [*self.batch_acc, np.array(r.batch_accuracy)][-(self.window + 1) :]
        self.val_acc = [*self.val_acc, float(r.val_accuracy)][-(self.window + 1) :]
        n = r.local_batch.size
        live = [i for i in range(n) if r.alive[i]]
        it = [max(float(v), 1e-9) for v in r.iteration_time_s]
        comp = [max(float(v), 1e-9) for v in r.compute_time_s]
        b = [float(v) for v in r.local_batch]
        rate = [b[i] / comp[i] for i in range(n)]
        idle = [float(r.idle_time_s[i]) / it[i] for i in range(n)]
        interval = max(r.interval_time_s, 1e-9)
        if live:
            mean_b, mean_rate = _mean([b[i] for i in live]), _mean([rate[i] for i in live])
            slowest, iter_mean = max(comp[i] for i in live), _mean([it[i] for i in live])
            mean_idle = _mean([idle[i] for i in live])
        else:
            mean_b = mean_rate = slowest = iter_mean = 1.0
            mean_idle = 0.0
        rows = []
        for i in range(n):
            alive = bool(r.alive[i])
            raw = {
                "net_throughput": math.log10(1.0 + 1e-6 * float(r.net_bytes_per_s[i])),
                "tcp_retransmissions": math.log10(1.0 + float(r.tcp_retransmissions[i]) / interval),
                "cpu_util": float(r.cpu_util[i]),
                "mem_util": float(r.mem_util[i]),
                "iteration_time": math.log10(it[i]),
                "compute_time": math.log10(comp[i]),
                "idle_fraction": idle[i] if alive else 0.0,
                "local_batch": math.log2(b[i]),
                "batch_accuracy": float(r.batch_accuracy[i]),
                "accuracy_gain": float(r.batch_accuracy[i] - self.batch_acc[0][i]),
                "grad_norm_mean": math.log10(max(float(r.grad_norm_mean[i]), 1e-12)),
                "grad_norm_var": math.log10(float(r.grad_norm_var[i]) + 1e-12),
                "compute_share": comp[i] / slowest if alive else 0.0,
                "batch_ratio": math.log2(b[i]) - math.log2(max(mean_b, 1e-12)),
                "speed_ratio": math.log2(rate[i] / max(mean_rate, 1e-12)) if alive else W_FEATURES[14].low,
                "headroom_up": math.log2(float(spec.max_batch[i])) - math.log2(b[i]),
                "headroom_down": math.log2(b[i]) - math.log2(float(spec.min_batch[i])),
                "gpu_util": float(r.gpu_util[i]),
                "alive": 1.0 if alive else 0.0,
            }
            rows.append([_norm(raw[f.name], f) for f in W_FEATURES])
        m = max(r.global_batch, 1)
        bn = self.noise_scale()
        bn = float(spec.base_batch) if bn is None else bn
        glob_raw = {
            "val_accuracy": r.val_accuracy,
            "val_loss": r.val_loss / math.log(spec.num_classes),
            "accuracy_to_target": spec.target_accuracy - r.val_accuracy,
            "val_accuracy_gain": r.val_accuracy - self.val_acc[0],
            "global_batch": math.log2(m),
            "noise_scale": math.log10(max(bn, 1.0)),
            "noise_to_batch": math.log2(max(bn, 1e-9) / m),
            "efficiency": (bn + spec.base_batch) / (bn + m),
            "time_used": r.wall_time_s / spec.time_budget_s,
            "comm_fraction": min(r.comm_time_s / iter_mean, 1.0),
            "mean_idle_fraction": mean_idle,
            "num_workers": math.log2(max(len(live), 1)),
            "interval_time": math.log10(interval),
        }
        glob = [_norm(glob_raw[f.name], f) for f in G_FEATURES]
        return np.array(rows, dtype=np.float32), np.array(glob, dtype=np.float32)


def reference_reward(cfg: RewardConfig, r, prev: float | None, reached: bool) -> dict[str, float]:
    if cfg.kind == "time":
        return {
            "time": -r.interval_time_s / cfg.time_scale_s,
            "target_bonus": cfg.target_bonus if reached else 0.0,
        }
    idx = [i for i in range(r.local_batch.size) if r.alive[i]] or list(range(r.local_batch.size))
    devs = [math.log2(max(float(r.local_batch[i]), 1.0)) - cfg.regulariser_center_log2 for i in idx]
    var = [float(r.grad_norm_var[i]) for i in idx]
    acc = float(r.val_accuracy)
    return {
        "accuracy": acc,
        "accuracy_gain": cfg.alpha * (0.0 if prev is None else max(0.0, acc - prev)),
        "iteration_time": -cfg.beta * _mean([float(r.iteration_time_s[i]) for i in idx]),
        "batch_regulariser": -cfg.delta * _mean([abs(d) if cfg.regulariser == "abs" else d for d in devs]),
        "stability": -cfg.eta * _mean([v + math.sqrt(v) for v in var]),
    }


def _reports(workers: int, scenario: str, seed: int, steps: int):
    """Reports from a random rollout, plus copies with workers marked dead (and all dead)."""
    yield from rollout_reports(
        HeteroClusterEnv(workers=workers, scenario=scenario, max_decisions=None), seed, steps
    )


def rollout_reports(env: HeteroClusterEnv, seed: int, steps: int, seed_actions: bool = False):
    """Reports of a random rollout of ``env``, plus copies with workers marked dead (and all dead);
    ``seed_actions``: the action space's sampler seeded too."""
    env.reset(seed=seed)
    if seed_actions:
        env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    n = env.num_workers
    yield env.last_report
    for _ in range(steps):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        report = info["report"]
        yield report
        if rng.random() < 0.3:
            yield dataclasses.replace(report, alive=report.alive & (rng.random(n) < 0.6))
        if rng.random() < 0.05:
            yield dataclasses.replace(report, alive=np.zeros(n, dtype=bool))
        if terminated or truncated:
            env.reset(seed=seed + 1)
    env.close()


@pytest.mark.parametrize(("workers", "scenario"), [(4, "mixed"), (5, "throttle"), (16, "mixed")])
def test_encoder_and_noise_estimate_match_the_plain_reference(workers, scenario):
    env = HeteroClusterEnv(workers=workers, scenario=scenario)
    spec = env.backend.spec
    fast, ref = ObservationEncoder(spec), ReferenceEncoder(spec)
    estimator = NoiseScaleEstimator()
    checked = 0
    for report in _reports(workers, scenario, seed=workers, steps=150):
        expected = reference_two_batch(report)
        got = two_batch_estimates(report)
        assert (got is None) == (expected is None)
        if got is not None:
            np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-12)
        estimator.update(report)
        obs = fast.encode(report)
        worker, glob = (
            obs[: workers * OBS_SCHEMA.worker_dim].reshape(workers, -1),
            obs[workers * OBS_SCHEMA.worker_dim :],
        )
        ref_worker, ref_glob = ref.update(report)
        assert worker.dtype == glob.dtype == np.float32
        np.testing.assert_allclose(worker, ref_worker, rtol=0, atol=2e-6)
        np.testing.assert_allclose(glob, ref_glob, rtol=0, atol=2e-6)
        checked += 1
    assert checked > 150


@pytest.mark.parametrize("regulariser", ["abs", "signed"])
@pytest.mark.parametrize("kind", ["dynamix", "time"])
def test_reward_matches_the_plain_reference(kind, regulariser):
    cfg = RewardConfig(kind=kind, regulariser=regulariser, alpha=2.0, beta=0.7, delta=0.3, eta=0.2)
    prev = None
    for report in _reports(6, "mixed", seed=3, steps=80):
        reached = report.val_accuracy > 0.9
        total, terms = compute_reward(cfg, report, prev, reached)
        expected = reference_reward(cfg, report, prev, reached)
        assert terms.keys() == expected.keys()
        for name, value in expected.items():
            assert terms[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
        assert total == pytest.approx(sum(expected.values()), rel=1e-12, abs=1e-12)
        prev = float(report.val_accuracy)
