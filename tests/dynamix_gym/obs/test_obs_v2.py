"""Observation schema 2 (scale-free): the fast encoder against a plain per-worker reference, the
env's observations in their space, workloads that look alike where their decisions are alike, and
bundles that record their schema and refuse another."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from support import HEADLINE_BUNDLE
from test_obs_v1_reference import (  # the schema-1 reference's helpers
    ReferenceNoise,
    _mean,
    _norm,
    rollout_reports,
)

from dynamix_gym import HeteroClusterEnv, PerWorkerEnv
from dynamix_gym.controllers.bundle import (
    BundleMeta,
    BundleMismatchError,
    PPOController,
    load_bundle,
    save_bundle,
)
from dynamix_gym.envs.vec_env import PerWorkerVecEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.obs import OBS_SCHEMA, OBS_SCHEMA_V2, ScaleFreeEncoder, get_schema, make_encoder
from dynamix_gym.stats import MAX_NOISE_SCALE
from sim.cluster import homogeneous_cluster
from sim.protocol import IntervalReport

W_FEATURES, G_FEATURES = OBS_SCHEMA_V2.worker_features, OBS_SCHEMA_V2.global_features
MSS = 1448


class ReferenceV2(ReferenceNoise):
    """Schema 2 one worker at a time in plain Python, straight from the schema's table."""

    def __init__(self, spec, window: int = 4, smoothing: float = 0.2) -> None:
        super().__init__(smoothing)
        self.spec, self.window = spec, window
        self.val_q: list[float] = []
        self.tput: list[float] = []
        n = spec.num_workers
        self.rate0: list[float | None] = [None] * n
        self.cpu0: list[float | None] = [None] * n
        self.g0: list[float | None] = [None] * n
        self.q0 = self.loss0 = self.interval0 = self.it0 = self.tput0 = self.bn0 = None

    def update(self, r) -> tuple[np.ndarray, np.ndarray]:
        spec, n = self.spec, self.spec.num_workers
        self.absorb(r)
        live = [i for i in range(n) if r.alive[i]]
        interval = max(r.interval_time_s, 1e-9)
        b = [float(v) for v in r.local_batch]
        comp = [max(float(v), 1e-9) for v in r.compute_time_s]
        it = [max(float(v), 1e-9) for v in r.iteration_time_s]
        g = [max(float(v), 1e-12) for v in r.grad_norm_mean]
        net = [max(float(v), 1e-12) for v in r.net_bytes_per_s]
        rate = [b[i] / comp[i] for i in range(n)]
        idle = [float(r.idle_time_s[i]) / it[i] for i in range(n)]
        if live:
            mean_b, mean_rate = _mean([b[i] for i in live]), _mean([rate[i] for i in live])
            mean_g, mean_net = _mean([g[i] for i in live]), _mean([net[i] for i in live])
            slowest, iter_mean = max(comp[i] for i in live), _mean([it[i] for i in live])
            mean_idle = _mean([idle[i] for i in live])
        else:
            mean_b = mean_rate = mean_g = mean_net = slowest = iter_mean = 1.0
            mean_idle = 0.0
        rows = []
        for i in range(n):
            alive = bool(r.alive[i])
            if alive and self.rate0[i] is None:
                self.rate0[i], self.cpu0[i], self.g0[i] = rate[i], float(r.cpu_util[i]), g[i]
            lo, hi = math.log2(float(spec.min_batch[i])), math.log2(float(spec.max_batch[i]))
            sent = max(net[i] * interval / MSS, 1.0)
            raw = {
                "batch_position": (math.log2(b[i]) - lo) / (hi - lo) if hi > lo else 0.0,
                "batch_ratio": math.log2(b[i] / mean_b),
                "speed_ratio": math.log2(rate[i] / mean_rate),
                "speed_trend": math.log2(rate[i] / self.rate0[i]) if self.rate0[i] else 0.0,
                "compute_share": comp[i] / slowest,
                "idle_fraction": idle[i],
                "gpu_util": float(r.gpu_util[i]),
                "cpu_util_change": float(r.cpu_util[i]) - self.cpu0[i] if self.cpu0[i] is not None else 0.0,
                "net_share": math.log2(net[i] / mean_net),
                "retransmit_rate": math.log10(max(float(r.tcp_retransmissions[i]) / sent, 1e-6)),
                "grad_norm_ratio": math.log2(g[i] / mean_g),
                "grad_norm_cv": math.log10(max(math.sqrt(float(r.grad_norm_var[i])) / g[i], 1e-6)),
                "grad_norm_trend": math.log2(g[i] / self.g0[i]) if self.g0[i] else 0.0,
                "alive": 1.0 if alive else 0.0,
            }
            if not alive:
                for k in ("compute_share", "idle_fraction", "cpu_util_change"):
                    raw[k] = 0.0
                for f in W_FEATURES:
                    if f.name in ("speed_ratio", "speed_trend", "net_share") or f.name.startswith(
                        "grad_norm"
                    ):
                        raw[f.name] = f.low
            rows.append([_norm(raw[f.name], f) for f in W_FEATURES])
        q, loss = float(r.val_accuracy), max(float(r.val_loss), 1e-12)
        tput = max(r.samples / interval, 1e-12)
        if self.q0 is None:
            self.q0, self.loss0, self.interval0 = q, loss, interval
        if self.it0 is None and live:
            self.it0 = iter_mean
        if self.tput0 is None and r.samples > 0:
            self.tput0 = tput
        bn = self.noise_scale()
        if self.bn0 is None and bn is not None and bn < MAX_NOISE_SCALE:
            self.bn0 = max(bn, 1e-9)
        self.val_q = [*self.val_q, q][-(self.window + 1) :]
        self.tput = [*self.tput, tput][-(self.window + 1) :]
        span = max(spec.target_accuracy - self.q0, 0.01)
        m = max(r.global_batch, 1)
        bn_value = max(bn if bn is not None else float(spec.base_batch), 1e-9)
        lo_sum = sum(float(spec.min_batch[i]) for i in live)
        hi_sum = sum(float(spec.max_batch[i]) for i in live)
        pos = (
            (math.log2(m) - math.log2(lo_sum)) / (math.log2(hi_sum) - math.log2(lo_sum))
            if live and hi_sum > lo_sum
            else 0.0
        )
        glob_raw = {
            "progress": (q - self.q0) / span,
            "progress_gain": (q - self.val_q[0]) / span,
            "val_loss_trend": math.log2(loss / self.loss0),
            "noise_to_batch": math.log2(bn_value / m),
            "noise_scale_trend": math.log2(bn_value / self.bn0) if self.bn0 else 0.0,
            "global_batch_position": pos,
            "time_used": r.wall_time_s / spec.time_budget_s,
            "interval_time_trend": math.log2(interval / self.interval0),
            "iteration_time_trend": math.log2(iter_mean / self.it0) if self.it0 and live else 0.0,
            "throughput_trend": math.log2(tput / self.tput0) if self.tput0 else 0.0,
            "throughput_gain": math.log2(tput / self.tput[0]),
            "comm_fraction": min(r.comm_time_s / iter_mean, 1.0),
            "mean_idle_fraction": mean_idle,
            "reconfig_fraction": min(r.reconfig_time_s / interval, 1.0),
            "live_fraction": len(live) / n,
        }
        glob = [_norm(glob_raw[f.name], f) for f in G_FEATURES]
        return np.array(rows, dtype=np.float32), np.array(glob, dtype=np.float32)


def _reports(env: HeteroClusterEnv, seed: int, steps: int):
    """Reports of a random rollout, plus copies with workers marked dead (and all dead)."""
    return rollout_reports(env, seed, steps, seed_actions=True)


@pytest.mark.parametrize(
    ("workload", "workers", "scenario"),
    [("cifar10", 4, "mixed"), ("bert", 5, "throttle"), ("ncf", 7, "mixed")],
)
def test_schema2_encoder_matches_the_plain_reference(workload, workers, scenario):
    env = HeteroClusterEnv(workload=workload, workers=workers, scenario=scenario, obs_schema=2)
    spec = env.backend.spec
    # A worker dead from the first report on reads trends of 0 until it first comes alive.
    first_dead = dataclasses.replace(env.reset(seed=0)[1]["report"], alive=np.arange(workers) != 1)
    fast, ref = ScaleFreeEncoder(spec), ReferenceV2(spec)
    checked = 0
    for report in [first_dead, *_reports(env, seed=workers, steps=120)]:
        obs = fast.encode(report)
        fw = OBS_SCHEMA_V2.worker_dim
        worker, glob = obs[: workers * fw].reshape(workers, fw), obs[workers * fw :]
        ref_worker, ref_glob = ref.update(report)
        assert obs.dtype == np.float32
        np.testing.assert_allclose(worker, ref_worker, rtol=0, atol=2e-6)
        np.testing.assert_allclose(glob, ref_glob, rtol=0, atol=2e-6)
        checked += 1
    assert checked > 120
    fast.reset()
    again = ScaleFreeEncoder(spec)
    assert np.array_equal(fast.encode(first_dead), again.encode(first_dead))  # reset forgets the run


def test_schema_registry_and_tables():
    assert get_schema(1) is OBS_SCHEMA and get_schema("2") is OBS_SCHEMA_V2
    assert OBS_SCHEMA_V2.version == "2" and OBS_SCHEMA_V2.per_worker_dim == 29
    assert len(set(OBS_SCHEMA_V2.per_worker_names())) == OBS_SCHEMA_V2.per_worker_dim
    assert "| 0 | self.batch_position | fraction | [0, 1] |" in OBS_SCHEMA_V2.as_table()
    for f in (*W_FEATURES, *G_FEATURES):
        assert f.low < f.high, f.name
    spec = HeteroClusterEnv(workers=2).backend.spec
    assert isinstance(make_encoder(2, spec), ScaleFreeEncoder)
    for bad in (5, "v2", None, True, 1.0):
        with pytest.raises(ValueError, match=r"obs_schema must be one of \['1', '2', '3', '4'\]"):
            HeteroClusterEnv(workers=2, obs_schema=bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: HeteroClusterEnv(workers=4, scenario="mixed", obs_schema=2),
        lambda: HeteroClusterEnv(workers=3, workload="bert", obs_schema=2),
        lambda: PerWorkerEnv(workers=3, workload="ncf", obs_schema=2),
    ],
    ids=["cifar10", "bert", "ncf-per-worker"],
)
def test_schema2_envs_pass_the_checkers(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(make(), skip_render_check=True)
        sb3_check_env(make(), warn=True)


@pytest.mark.parametrize("workload", ["cifar10", "bert", "ncf"])
@pytest.mark.parametrize("scenario", ["mixed", "interference"])
def test_schema2_observations_stay_in_the_space(workload, scenario):
    env = HeteroClusterEnv(workload=workload, workers=5, scenario=scenario, obs_schema=2, interval=20)
    obs, _ = env.reset(seed=11)
    assert obs.shape == (OBS_SCHEMA_V2.centralised_dim(5),)
    env.action_space.seed(11)
    for _ in range(60):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        if terminated or truncated:
            obs, _ = env.reset()
    rows = env.per_worker_observations()
    assert rows.shape == (5, OBS_SCHEMA_V2.per_worker_dim)


def test_schema1_default_is_unchanged_by_the_schema2_code():
    """The same seed gives bit-identical schema-1 observations with obs_schema=1 and the default."""
    a, b = (
        HeteroClusterEnv(workers=4, scenario="mixed"),
        HeteroClusterEnv(workers=4, scenario="mixed", obs_schema=1),
    )
    oa, ob = a.reset(seed=3)[0], b.reset(seed=3)[0]
    for _ in range(20):
        assert np.array_equal(oa, ob)
        oa, ob = a.step(np.full(4, 3))[0], b.step(np.full(4, 3))[0]
    assert a.obs_schema is OBS_SCHEMA and oa.shape == (OBS_SCHEMA.centralised_dim(4),)


# --- the same decision situation on three workloads ------------------------------------------------


def _situation(spec, scale: IntervalReport, step: int) -> IntervalReport:
    """Interval ``step`` of one decision situation, in a workload's own units.

    Relative facts (identical on every workload): every worker's batch halfway (in octaves)
    through its range; worker 2 slows to half speed from step 3 on; the noise scale is 4x the global
    batch; quality goes a tenth of the way from its start to the target per interval. The
    workload's units (seconds per sample, gradient norm, bytes, loss) come from ``scale``, a real
    warm-up report of that workload.
    """
    n = spec.num_workers
    lo, hi = np.log2(spec.min_batch.astype(float)), np.log2(spec.max_batch.astype(float))
    b = np.rint(2.0 ** (lo + 0.5 * (hi - lo))).astype(np.int64)
    speed = np.ones(n)
    if step >= 3:
        speed[2] = 0.5
    s_per_sample = float(np.mean(scale.compute_time_s / scale.local_batch))
    comp = b * s_per_sample / speed
    slowest = comp.max()
    comm = 0.25 * slowest
    it = np.full(n, slowest + comm)
    g_scale = float(np.mean(scale.grad_norm_mean))
    m = int(b.sum())
    g2 = g_scale**2 * 0.01
    sigma = 4.0 * m * g2  # B_noise = tr(Sigma) / |G|^2 = 4 M
    local_sqr = g2 + sigma / b
    norms = np.sqrt(local_sqr)
    bytes_per_s = float(np.mean(scale.net_bytes_per_s))
    iterations = 50
    interval = iterations * float(it[0])
    q0 = 0.2 * spec.target_accuracy
    q = q0 + 0.1 * step * (spec.target_accuracy - q0)
    loss0 = 2.0 * max(float(scale.val_loss), 1e-3)
    return IntervalReport(
        local_batch=b,
        alive=np.ones(n, dtype=bool),
        iteration_time_s=it,
        compute_time_s=comp,
        idle_time_s=slowest - comp,
        samples_per_s=b * iterations / interval,
        net_bytes_per_s=np.full(n, bytes_per_s),
        tcp_retransmissions=np.full(n, 1e-4 * bytes_per_s * interval / MSS),
        cpu_util=np.full(n, 0.3),
        mem_util=np.full(n, 0.05),
        gpu_util=0.9 * comp / it,
        gpu_mem_util=np.full(n, 0.5),
        batch_accuracy=np.full(n, q),
        batch_loss=np.full(n, loss0),
        grad_norm_mean=norms,
        grad_norm_var=(0.1 * norms) ** 2,
        local_grad_sqr=local_sqr,
        iterations=iterations,
        interval_time_s=interval,
        wall_time_s=(step + 1) * interval,
        reconfig_time_s=0.0,
        comm_time_s=comm,
        global_batch=m,
        global_grad_sqr=g2 + sigma / m,
        val_accuracy=q,
        val_loss=loss0 * 0.9**step,
        samples=m * iterations,
        epoch=0.1 * step,
    )


def _encode_situation(workload: str, schema: int) -> np.ndarray:
    env = HeteroClusterEnv(cluster=homogeneous_cluster("V100", 4), workload=workload, obs_schema=schema)
    env.reset(seed=0)
    spec, scale = env.backend.spec, env.last_report
    encoder = make_encoder(schema, spec)
    obs = None
    for step in range(6):
        obs = encoder.encode(_situation(spec, scale, step))
    return obs


def test_the_same_situation_on_cifar10_bert_and_ncf_encodes_alike_only_in_schema2():
    v2 = {w: _encode_situation(w, 2) for w in ("cifar10", "bert", "ncf")}
    v1 = {w: _encode_situation(w, 1) for w in ("cifar10", "bert", "ncf")}
    names = OBS_SCHEMA_V2.centralised_names(4)
    time_used = names.index("global.time_used")  # the budgets differ: the only workload-set scale
    keep = np.arange(len(names)) != time_used
    for w in ("bert", "ncf"):
        gap = np.abs(v2[w] - v2["cifar10"])[keep]
        assert gap.max() < 0.02, (w, names[int(np.argmax(np.where(keep, np.abs(v2[w] - v2["cifar10"]), 0)))])
        assert np.abs(v1[w] - v1["cifar10"]).max() > 0.3  # schema 1 tells the workloads apart
    # The situation is not trivial: the slowed worker and the noise show in schema 2.
    row = {n: v for n, v in zip(names, v2["cifar10"], strict=True)}
    assert row["w2.speed_ratio"] < row["w0.speed_ratio"] and row["w2.compute_share"] == pytest.approx(1.0)
    assert row["global.noise_to_batch"] == pytest.approx(2.0 / 12.0, abs=1e-4)  # log2(4) on [-12, 12]


# --- bundles record their schema ------------------------------------------------------------------


def _save_schema2_bundle(path):
    vec = PerWorkerVecEnv([lambda: HeteroClusterEnv(workers=3, obs_schema=2, max_decisions=3)])
    assert vec.observation_space.shape == (OBS_SCHEMA_V2.per_worker_dim,)
    model = PPO("MlpPolicy", vec, n_steps=8, batch_size=8, seed=0, device="cpu")
    schema = vec.get_attr("obs_schema", [0])[0]
    meta = BundleMeta(
        obs_form="per_worker", action_set=[-100, -25, 0, 25, 100], schema_version=schema.version
    )
    return save_bundle(path, model, meta, None)


def test_a_schema2_bundle_records_its_schema_and_refuses_a_schema1_env(tmp_path):
    path = _save_schema2_bundle(tmp_path / "b")
    raw = json.loads((path / "bundle.json").read_text())
    assert raw["schema_version"] == "2" and raw["feature_names"] == OBS_SCHEMA_V2.per_worker_names()
    assert raw["action_mode"] == "delta"
    controller = PPOController(path)
    res = run_episode(HeteroClusterEnv(workers=5, obs_schema=2, max_decisions=3), controller, seed=0)
    assert res.summary["decisions"] == 3
    with pytest.raises(BundleMismatchError, match=r"schema '2'.*obs_schema=2"):
        run_episode(HeteroClusterEnv(workers=5, max_decisions=3), controller, seed=0)
    raw["feature_names"] = OBS_SCHEMA.per_worker_names()  # schema 2 claimed with schema 1's features
    (path / "bundle.json").write_text(json.dumps(raw))
    with pytest.raises(BundleMismatchError, match="differ from that schema"):
        load_bundle(path)
    raw["schema_version"] = "5"
    (path / "bundle.json").write_text(json.dumps(raw))
    with pytest.raises(BundleMismatchError, match=r"schema '5'.*\['1', '2', '3', '4'\]"):
        load_bundle(path)


def test_the_schema1_headline_bundle_still_loads_and_refuses_a_schema2_env():
    bundle = load_bundle(HEADLINE_BUNDLE)
    assert bundle.meta.schema_version == "1" and bundle.meta.action_mode == "delta"
    controller = PPOController(bundle=bundle)
    controller.check_env(HeteroClusterEnv(workers=8))
    with pytest.raises(BundleMismatchError, match="schema '1'"):
        controller.check_env(HeteroClusterEnv(workers=8, obs_schema=2))


def test_per_worker_vec_env_refuses_mixed_schemas():
    with pytest.raises(ValueError, match="one observation schema"):
        PerWorkerVecEnv(
            [lambda: HeteroClusterEnv(workers=2), lambda: HeteroClusterEnv(workers=2, obs_schema=2)]
        )


# --- one interface: the real DDP backend's env takes the same schema ---------------------------------


def test_the_real_ddp_env_factory_takes_obs_schema_and_the_scale_mode():
    from adapters.ddp_env import make_real_ddp_env

    env = make_real_ddp_env(workers=2, obs_schema=2, action_mode="scale")
    try:
        assert env.obs_schema is OBS_SCHEMA_V2 and env.observation_space.shape == (
            OBS_SCHEMA_V2.centralised_dim(2),
        )
        assert env.action_mode == "scale"
    finally:
        env.close()


@pytest.mark.slow
def test_a_real_ddp_run_encodes_schema2_and_takes_masked_scale_steps():
    from adapters.ddp_env import make_real_ddp_env

    env = make_real_ddp_env(workers=2, obs_schema=2, action_mode="scale", interval=2, max_decisions=2)
    try:
        obs, info = env.reset(seed=0)
        assert env.observation_space.contains(obs) and info["report"].truth is None
        masks = env.action_mask_matrix()
        legal = np.array([int(np.flatnonzero(row)[-1]) for row in masks])  # the largest legal factor
        obs, _, _, _, info = env.step(legal)
        assert env.observation_space.contains(obs) and info["clipped"] == []
    finally:
        env.close()
