"""RandomizedClusterEnv: a new cluster mix, fault intensity and workload every episode."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from dynamix_gym.backends.sim_backend import SimBackend
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from sim.cluster import GPUS_PER_NODE, mixed_cluster
from sim.convergence import ConvergenceParams, with_batch_dependence, with_gradient_noise, with_horizon
from sim.faults import FaultWindow, compose_scenarios, get_scenario, scale_intensity
from sim.hardware import ComputeParams, compute_params
from sim.instability import InstabilityParams
from sim.profile import SHIPPED_MODELS, ClusterProfile, load_profile
from sim.validation import check_choice, check_int, check_min_max, check_range
from sim.workloads import get_workload


@lru_cache(maxsize=8)
def _profile(ref: str) -> ClusterProfile:
    return load_profile(ref)


def _fitted_convergence(workload: str) -> ConvergenceParams:
    """The shipped convergence model of ``workload`` (the base a generated one is drawn around)."""
    return SHIPPED_MODELS.convergence_params(get_workload(workload).convergence)


def _fitted_compute(cluster, workload: str) -> dict[str, ComputeParams]:
    """The fitted compute curve of each GPU type of ``cluster`` for ``workload``, by type name."""
    app = get_workload(workload).app
    return {g: compute_params(g, app) for g in sorted(set(cluster.gpu_types))}


def _check_pair(name: str, pair, check_one) -> None:
    """``domain.<name>`` as a [low, high] pair: two entries, each passing ``check_one(field, v)``,
    low <= high (each error names the field)."""
    if len(pair) != 2:
        raise ValueError(f"domain.{name} must be a [low, high] pair, got {pair!r}")
    for i, v in enumerate(pair):
        check_one(f"domain.{name}[{i}]", v)
    check_min_max(f"domain.{name}[0]", pair[0], f"domain.{name}[1]", pair[1])


@dataclass(frozen=True)
class DomainRandomization:
    """What changes from one training episode to the next (the worker count stays fixed per env).

    Per episode: the T4 share of the cluster ~ U(t4_fraction) (the rest V100, with probability
    ``third_type_probability`` some RTX2080Ti too), each worker's static speed ~ exp(N(0, speed_sd)),
    a scenario family from ``scenarios`` with its fault rates scaled by ~ U(intensity), a workload
    from ``workloads``, and 0 to ``throttle_windows`` scheduled throttling windows (a random worker
    at speed x U(window_factor) from U(window_start_s) for U(window_duration_s) seconds).

    Generated compute curves (off by default): with ``compute_sd`` > 0 or an ``exponent_scale``
    other than (1, 1), every GPU type of the episode's cluster gets its fitted curve
    (:class:`sim.hardware.ComputeParams` of the workload's application) redrawn: launch floor
    ``alpha_s``, per-sample cost ``beta_s`` and host floor ``host_s`` each times exp(N(0,
    compute_sd)), and the batch exponent times U(exponent_scale), within [0.25, 2] (an exponent
    above 1: a larger batch costs more per sample, as on the CPU ranks of the fidelity profile,
    1.23; the fitted GPU curves lie at 0.25-1.03). Memory caps stay the fitted ones.

    Generated learning-rate limits (off by default): with probability ``lr_limit_probability`` an
    episode's workload gets a limit on the learning rate its rule may reach, the stability factor
    of :func:`sim.scaling.lr_stability`: beyond a multiplier of the base learning rate drawn
    log-uniformly from ``lr_stable_gain``, progress per step falls as (g_s / g) ** q, q ~
    U(``lr_unstable_exponent``). The fitted shipped models have none; the schedule fit of the
    fidelity app's real task finds g_s = 2.0, q = 0.86 (``results/fidelity/schedules_fit.md``),
    where AdaScale's gain after a large batch increase destabilises real training.

    Generated gradient noise (off by default): with probability ``noise_probability`` an episode's
    workload has its gradient noise scale multiplied by a factor drawn log-uniformly from
    ``noise_scale_factor`` and a progress noise factor k (the noise that sets a batch's benefit to
    progress is k times the reported one, :mod:`sim.convergence`) drawn log-uniformly from
    ``progress_noise_factor``. The shipped workloads' noise scales lie at 10^2-10^7 samples, so a
    larger batch always pays; the real CPU tasks' estimators report 0.5-45 samples (k 3.9-17 fitted),
    where the best batch is the smallest, a regime the shipped worlds never show.

    Generated compute floors (off by default): with probability ``floor_probability`` every GPU type
    of the episode's cluster has its launch and host floors times a factor drawn log-uniformly from
    ``floor_scale``, so that a step costs in proportion to its batch, as on the real CPU ranks.

    Generated horizons (off by default): with probability ``horizon_probability`` an episode's
    workload reaches its target in a fraction of its fitted steps, drawn log-uniformly from
    ``horizon_scale`` (:func:`sim.convergence.with_horizon`: every progress quantity scaled, the
    curves over the fraction of training kept). The shipped workloads take hundreds of decisions to
    their targets, so a quality gain of more than a few percent of the way per `window` intervals
    never shows; the real CPU tasks reach theirs in 10-30 decisions, half the way in four.

    Generated batch dependence (off by default): with probability ``batch_dependence_probability``
    (only in the generated horizons' short worlds with ``batch_dependence_short_only``) an episode's
    workload has its stretch per doubling drawn from U(``stretch_exponent``) and its batch memory from
    logU(``memory_fraction``) of its run (:func:`sim.convergence.with_batch_dependence`). The shipped
    models' batch dependence comes from static curves, which cannot identify it: their stretch is
    0-0.07 and their memory a tenth of the run, set by default, so an early large batch is nearly
    free; refitted to real runs whose batches change (``experiments.fit_campaigns``), the real CPU
    tasks give stretch 0.07 / 0.31 and memory 0.45 / 0.67 of the run (LM / CNN).

    Compound fault worlds (off by default): with probability ``compound_probability`` an episode
    runs ``k ~ U{compound_families}`` distinct families of ``scenarios`` at once (the first the
    episode's drawn family, the others drawn without replacement, each scaled by its own intensity
    draw), merged by :func:`sim.faults.compose_scenarios`: faults of several kinds overlap, as on a
    shared cluster, where a single family per episode never shows them together.

    With ``profile`` (a calibrated cluster profile, see ``python -m experiments.calibrate``) the
    cluster, workload and fitted models are the profile's: ``workers`` must equal its worker count,
    and ``t4_fraction``, ``third_type_probability`` and ``workloads`` are not used. Pretraining on a
    profile is how a policy is prepared for the cluster that was measured.
    """

    workers: int = 8
    t4_fraction: tuple[float, float] = (0.25, 0.75)
    third_type_probability: float = 0.2
    speed_sd: float = 0.1
    scenarios: tuple[str, ...] = ("static_hetero", "throttle", "jitter", "interference", "mixed")
    intensity: tuple[float, float] = (0.5, 2.0)
    workloads: tuple[str, ...] = ("cifar10",)
    throttle_windows: int = 0
    window_start_s: tuple[float, float] = (0.0, 600.0)
    window_duration_s: tuple[float, float] = (10.0, 300.0)
    window_factor: tuple[float, float] = (0.3, 0.8)
    profile: str | None = None
    #: Generated mixes (when not empty, instead of the T4 / V100 / RTX2080Ti draw): 1 to
    #: ``max_types`` distinct types from ``gpu_types`` (at most one per worker), each with at least
    #: one worker and the rest split by a flat Dirichlet draw.
    gpu_types: tuple[str, ...] = ()
    max_types: int = 4
    compute_sd: float = 0.0
    exponent_scale: tuple[float, float] = (1.0, 1.0)
    lr_limit_probability: float = 0.0
    lr_stable_gain: tuple[float, float] = (1.5, 8.0)
    lr_unstable_exponent: tuple[float, float] = (0.5, 1.5)
    compound_probability: float = 0.0
    compound_families: tuple[int, int] = (2, 3)
    #: Generated instability (sim.instability; off at 0): with this probability an episode's run can
    #: collapse at a rise of its learning rate, the rate where the chance is one half ~ logU(
    #: instability_half_gain), the slope per log2 of the rate ~ U(instability_slope), the ramp's
    #: effect on the logit ~ U(instability_ramp_effect), the share of progress lost ~ U(instability_depth)
    #: (the digits CNN's fit: half at 4.0, slope 5.3, ramp -2.1, depth 1; results/instability/).
    instability_probability: float = 0.0
    instability_half_gain: tuple[float, float] = (2.0, 16.0)
    instability_slope: tuple[float, float] = (2.0, 8.0)
    instability_ramp_effect: tuple[float, float] = (-3.0, 0.0)
    instability_depth: tuple[float, float] = (0.5, 1.0)
    #: Generated gradient noise (off at 0; sim.convergence.with_gradient_noise): with this probability
    #: an episode's workload has its gradient noise scale times ~ logU(noise_scale_factor) and its
    #: progress noise factor k ~ logU(progress_noise_factor) (the real CPU tasks: a reported noise of
    #: 0.5-45 samples, k 3.9-17; the shipped workloads' noise 10^2-10^7, k 1).
    noise_probability: float = 0.0
    noise_scale_factor: tuple[float, float] = (1e-4, 1.0)
    progress_noise_factor: tuple[float, float] = (1.0, 32.0)
    #: Generated compute floors (off at 0): with this probability every GPU type of an episode's
    #: cluster has its launch floor ``alpha_s`` and host floor ``host_s`` times ~ logU(floor_scale)
    #: (a host that computes in proportion to the batch, as the real CPU ranks do: a floor of 3 ms
    #: beside 2.6 ms per sample on the LM, where the shipped GPU fits' floors are 5-250 ms).
    floor_probability: float = 0.0
    floor_scale: tuple[float, float] = (0.01, 1.0)
    #: Generated horizons (off at 0; sim.convergence.with_horizon): with this probability an episode's
    #: workload reaches its target in ~ logU(horizon_scale) times its fitted steps (the real CPU
    #: tasks: 10-30 decisions to the target, where the shipped workloads take hundreds).
    horizon_probability: float = 0.0
    horizon_scale: tuple[float, float] = (0.01, 1.0)
    #: Generated batch dependence (off at 0; sim.convergence.with_batch_dependence): with this
    #: probability (within the short worlds only, with ``batch_dependence_short_only``) an episode's
    #: workload has stretch ~ U(stretch_exponent) per doubling and batch memory ~ logU(memory_fraction)
    #: of its total progress (the real CPU tasks refitted to their campaigns' runs: stretch 0.07 /
    #: 0.31, memory 0.45 / 0.67; the shipped models 0-0.07 and 0.1, unmeasured).
    batch_dependence_probability: float = 0.0
    batch_dependence_short_only: bool = False
    stretch_exponent: tuple[float, float] = (0.0, 0.4)
    memory_fraction: tuple[float, float] = (0.1, 1.0)
    #: A fixed cluster (:class:`sim.cluster.ClusterSpec`) for every episode instead of a drawn mix:
    #: the replica of one job's cluster (the arbitrator's replica learner); ``workers`` must equal its
    #: worker count, and ``t4_fraction``, ``third_type_probability`` and ``gpu_types`` are not used.
    cluster: Any = None

    def __post_init__(self) -> None:
        check_int("domain.workers", self.workers, 2, 4096)
        for i, v in enumerate(self.t4_fraction):
            check_range(f"domain.t4_fraction[{i}]", v, 0.0, 1.0)
        check_min_max(
            "domain.t4_fraction[0]", self.t4_fraction[0], "domain.t4_fraction[1]", self.t4_fraction[1]
        )
        check_range("domain.third_type_probability", self.third_type_probability, 0.0, 1.0)
        check_int("domain.max_types", self.max_types, 1, 16)
        for g in self.gpu_types:
            check_choice("domain.gpu_types entry", g, GPUS_PER_NODE)
        if len(set(self.gpu_types)) != len(self.gpu_types):
            raise ValueError(f"domain.gpu_types lists a type twice: {list(self.gpu_types)}")
        check_range("domain.speed_sd", self.speed_sd, 0.0, 2.0)
        check_range("domain.compute_sd", self.compute_sd, 0.0, 2.0)
        _check_pair("exponent_scale", self.exponent_scale, lambda f, v: check_range(f, v, 0.1, 10.0))
        check_range("domain.intensity[0]", self.intensity[0], 0.0, 100.0)
        check_min_max("domain.intensity[0]", self.intensity[0], "domain.intensity[1]", self.intensity[1])
        check_int("domain.throttle_windows", self.throttle_windows, 0, 100)
        check_range("domain.lr_limit_probability", self.lr_limit_probability, 0.0, 1.0)
        check_range("domain.compound_probability", self.compound_probability, 0.0, 1.0)
        check_range("domain.instability_probability", self.instability_probability, 0.0, 1.0)
        check_range("domain.noise_probability", self.noise_probability, 0.0, 1.0)
        check_range("domain.floor_probability", self.floor_probability, 0.0, 1.0)
        check_range("domain.horizon_probability", self.horizon_probability, 0.0, 1.0)
        check_range("domain.batch_dependence_probability", self.batch_dependence_probability, 0.0, 1.0)
        if self.batch_dependence_short_only and self.horizon_probability == 0.0:
            raise ValueError(
                "domain.batch_dependence_short_only draws the batch dependence in the generated horizons' "
                "short worlds only, and domain.horizon_probability is 0: there are none"
            )
        _check_pair("compound_families", self.compound_families, lambda f, v: check_int(f, v, 2, 64))
        if self.compound_probability > 0.0 and len(set(self.scenarios)) < 2:
            raise ValueError(
                "domain.compound_probability > 0 needs at least two distinct domain.scenarios to combine"
            )
        for name, low, high, low_open in (
            ("window_start_s", 0.0, 1e9, False),
            ("window_duration_s", 0.0, 1e9, True),
            ("window_factor", 0.0, 1.0, True),
            ("lr_stable_gain", 1.0, 1e4, False),
            ("lr_unstable_exponent", 0.01, 10.0, False),
            ("instability_half_gain", 1.0, 1e4, False),
            ("instability_slope", 0.0, 100.0, False),
            ("instability_ramp_effect", -100.0, 0.0, False),
            ("instability_depth", 0.0, 1.0, True),
            ("noise_scale_factor", 1e-8, 1e8, False),
            ("progress_noise_factor", 1.0, 1e4, False),
            ("floor_scale", 0.0, 1e4, True),
            ("horizon_scale", 1e-6, 1e6, True),
            ("stretch_exponent", 0.0, 4.0, False),
            ("memory_fraction", 0.0, 100.0, True),
        ):
            _check_pair(
                name,
                getattr(self, name),
                lambda f, v, lo=low, hi=high, o=low_open: check_range(f, v, lo, hi, low_open=o),
            )
        if not self.scenarios or not self.workloads:
            raise ValueError("domain.scenarios and domain.workloads must not be empty")
        for name in self.scenarios:
            get_scenario(name)
        if self.cluster is not None:
            if self.profile is not None:
                raise ValueError(
                    "domain.cluster and domain.profile are exclusive (a profile names its cluster)"
                )
            size = getattr(self.cluster, "num_workers", None)
            if size is None:
                raise ValueError(
                    f"domain.cluster must be a sim.cluster.ClusterSpec, got {type(self.cluster).__name__}"
                )
            if self.workers != size:
                raise ValueError(f"domain.workers is {self.workers} but domain.cluster has {size} workers")
        if self.profile is not None:
            size = self.profile_spec().cluster.num_workers
            if self.workers != size:
                raise ValueError(
                    f"domain.workers is {self.workers} but profile {self.profile!r} measured a cluster "
                    f"of {size} workers; train on cluster_sizes of {size}"
                )

    def profile_spec(self) -> ClusterProfile:
        """The loaded profile (cached per path)."""
        if self.profile is None:
            raise ValueError("this domain has no profile")
        return _profile(self.profile)

    def _generated_mix(self, rng: np.random.Generator):
        n = self.workers
        k = int(rng.integers(1, min(self.max_types, len(self.gpu_types), n) + 1))
        types = [self.gpu_types[i] for i in rng.choice(len(self.gpu_types), size=k, replace=False)]
        extra = rng.multinomial(n - k, rng.dirichlet(np.ones(k))) if n > k else np.zeros(k, dtype=int)
        return mixed_cluster({g: 1 + int(e) for g, e in zip(types, extra, strict=True)})

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        n = self.workers
        if self.cluster is not None:
            cluster = self.cluster
        elif self.profile is None and self.gpu_types:
            cluster = self._generated_mix(rng)
        elif self.profile is None:
            n_t4 = int(np.clip(round(n * rng.uniform(*self.t4_fraction)), 1, n - 1))
            counts = {"T4": n_t4, "V100": n - n_t4}
            if n - n_t4 >= 2 and rng.random() < self.third_type_probability:
                k = int(rng.integers(1, n - n_t4))
                counts = {"T4": n_t4, "V100": n - n_t4 - k, "RTX2080Ti": k}
            cluster = mixed_cluster(counts)
        family = self.scenarios[int(rng.integers(len(self.scenarios)))]
        factor = float(rng.uniform(*self.intensity))
        speed = tuple(float(x) for x in np.exp(self.speed_sd * rng.standard_normal(n)))
        if self.profile is None:
            workload = self.workloads[int(rng.integers(len(self.workloads)))]
        windows = tuple(
            FaultWindow(
                kind="throttle",
                start_s=float(rng.uniform(*self.window_start_s)),
                duration_s=float(rng.uniform(*self.window_duration_s)),
                worker=int(rng.integers(n)),
                factor=float(rng.uniform(*self.window_factor)),
            )
            for _ in range(int(rng.integers(self.throttle_windows + 1)) if self.throttle_windows else 0)
        )
        base = scale_intensity(get_scenario(family), factor)
        scenario = replace(base, worker_speed=speed, windows=base.windows + windows)
        if self.profile is not None:
            prof = self.profile_spec()
            cv = (prof.meta.get("measured") or {}).get("compute_noise_cv")
            if cv is not None:  # the measured per-iteration spread of this cluster
                scenario = replace(scenario, compute_noise_cv=float(min(max(cv, 0.0), 1.0)))
            return {"cluster": prof.cluster, "scenario": scenario, "workload": prof.workload, "profile": prof}
        out = {"cluster": cluster, "scenario": scenario, "workload": workload}
        if self.compute_sd > 0.0 or tuple(self.exponent_scale) != (1.0, 1.0):
            out["compute_params"] = self._generated_compute(rng, cluster, workload)
        if self.lr_limit_probability > 0.0:  # no draw when off: the other worlds' streams stay as they were
            limited = rng.random() < self.lr_limit_probability
            lo, hi = np.log(self.lr_stable_gain)
            gain, exponent = (
                float(np.exp(rng.uniform(lo, hi))),
                float(rng.uniform(*self.lr_unstable_exponent)),
            )
            if limited:
                out["convergence_params"] = replace(
                    _fitted_convergence(workload), lr_stable_gain=gain, lr_unstable_exponent=exponent
                )
        if self.compound_probability > 0.0:  # drawn last, and only when on: other streams unchanged
            out["scenario"] = self._compound(rng, family, out["scenario"])
        if self.instability_probability > 0.0:  # after every other draw, and only when on
            unstable = rng.random() < self.instability_probability
            half = float(np.exp(rng.uniform(*np.log(self.instability_half_gain))))
            slope = float(rng.uniform(*self.instability_slope))
            ramp, depth = (
                float(rng.uniform(*self.instability_ramp_effect)),
                float(rng.uniform(*self.instability_depth)),
            )
            if unstable:
                out["instability"] = InstabilityParams(
                    "generated", -slope * np.log2(half), slope, ramp, depth
                )
        if self.noise_probability > 0.0:  # after every other draw, and only when on
            noisy = rng.random() < self.noise_probability
            factor = float(np.exp(rng.uniform(*np.log(self.noise_scale_factor))))
            k = float(np.exp(rng.uniform(*np.log(self.progress_noise_factor))))
            if noisy:
                fitted = out.get("convergence_params") or _fitted_convergence(workload)
                out["convergence_params"] = with_gradient_noise(fitted, factor, k)
        if self.floor_probability > 0.0:  # after every other draw, and only when on
            floored = rng.random() < self.floor_probability
            scale = float(np.exp(rng.uniform(*np.log(self.floor_scale))))
            if floored:
                params = out.get("compute_params") or _fitted_compute(cluster, workload)
                out["compute_params"] = {
                    g: replace(c, alpha_s=c.alpha_s * scale, host_s=c.host_s * scale)
                    for g, c in params.items()
                }
        if self.horizon_probability > 0.0:  # after every other draw, and only when on
            short = rng.random() < self.horizon_probability
            factor = float(np.exp(rng.uniform(*np.log(self.horizon_scale))))
            if short:
                fitted = out.get("convergence_params") or _fitted_convergence(workload)
                out["convergence_params"] = with_horizon(fitted, factor)
        if self.batch_dependence_probability > 0.0:  # after every other draw, and only when on
            dependent = rng.random() < self.batch_dependence_probability
            stretch = float(rng.uniform(*self.stretch_exponent))
            memory = float(np.exp(rng.uniform(*np.log(self.memory_fraction))))
            if self.batch_dependence_short_only:
                dependent = dependent and short
            if dependent:
                fitted = out.get("convergence_params") or _fitted_convergence(workload)
                out["convergence_params"] = with_batch_dependence(fitted, stretch, memory)
        return out

    def _compound(self, rng: np.random.Generator, family: str, scenario):
        """``scenario`` (the drawn ``family``'s) or, with ``compound_probability``, a compound of it
        and ``k - 1`` other distinct families, each at its own intensity draw."""
        # every draw is made whether or not the world is compound, so that the streams of the
        # episodes after it do not depend on this one's outcome
        compound = rng.random() < self.compound_probability
        others = sorted(set(self.scenarios) - {family})
        k = int(rng.integers(self.compound_families[0], self.compound_families[1] + 1))
        k = min(k, len(others) + 1)
        picked = [others[i] for i in rng.choice(len(others), size=k - 1, replace=False)]
        factors = rng.uniform(*self.intensity, size=len(picked))
        if not compound:
            return scenario
        parts = [scenario] + [
            scale_intensity(get_scenario(f), float(x)) for f, x in zip(picked, factors, strict=True)
        ]
        return compose_scenarios(parts, name="+".join([scenario.name, *(p.name for p in parts[1:])]))

    def _generated_compute(self, rng: np.random.Generator, cluster, workload) -> dict[str, ComputeParams]:
        out = {}
        for g, base in _fitted_compute(cluster, workload).items():
            a, b, h = np.exp(self.compute_sd * rng.standard_normal(3))
            e = float(np.clip(base.exponent * rng.uniform(*self.exponent_scale), 0.25, 2.0))
            out[g] = replace(
                base, alpha_s=base.alpha_s * float(a), beta_s=base.beta_s * float(b), host_s=base.host_s * float(h),
                exponent=e,
            )  # fmt: skip
        return out


class RandomizedClusterEnv(HeteroClusterEnv):
    """:class:`HeteroClusterEnv` (delta or continuous actions) whose simulated cluster, faults and
    workload are redrawn from ``domain`` at every reset, from the env's own generator.

    The ``time`` reward's scale (``time_scale``): ``"fixed"`` (default) keeps the reward config's
    ``time_scale_s`` for every world, so an episode's return is minus its wall time in those units
    and a ten-hour ImageNet world outweighs a ten-second NCF one a thousand-fold. ``"world"`` sets it
    per episode to the world's own time scale, read from the simulator's truth after the first
    interval: its wall time plus the shortest time to the target over the global batches (each at
    its equal-time split) held from then on at the current fault state, the noise scale growing
    with progress (:meth:`~dynamix_gym.controllers.oracle.OracleController.held_time_s`). Returns then read as
    minus the time to accuracy over that scale, near -1 in every world, which weighs worlds alike,
    as the benchmark's geometric mean of ratios does. The reward code is unchanged (its
    ``time_scale_s`` is set per world, ``info["time_scale_s"]`` at reset); a real backend keeps a
    fixed scale. Off the ``time`` reward, ``"world"`` is refused.

    Args:
        domain: a :class:`DomainRandomization` or a mapping of its fields.
        sim_kwargs: passed to every :class:`SimBackend`.
        time_scale: ``"fixed"`` or ``"world"`` (above).
        **kwargs: as :class:`HeteroClusterEnv` (``reward``, ``interval``, ``action_mode`` ...).
    """

    def __init__(
        self,
        domain: DomainRandomization | dict | None = None,
        sim_kwargs: dict | None = None,
        time_scale: str = "fixed",
        **kwargs,
    ):
        check_choice("env.time_scale", time_scale, TIME_SCALES)
        if isinstance(domain, dict) or domain is None:
            domain = DomainRandomization(**(domain or {}))
        self.domain = domain
        self._sim_kwargs = dict(sim_kwargs or {})
        first = domain.sample(np.random.default_rng(0))
        super().__init__(backend=SimBackend(**first, **self._sim_kwargs), **kwargs)
        self.episode_config: dict[str, Any] = first
        if time_scale == "world" and self.reward_config.kind != "time":
            raise ValueError(
                f"env.time_scale='world' scales the 'time' reward; the reward is {self.reward_config.kind!r}"
            )
        self.time_scale = time_scale
        self._base_reward = self.reward_config

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super(HeteroClusterEnv, self).reset(seed=seed)
        self.episode_config = self.domain.sample(self.np_random)
        self.set_backend(SimBackend(**self.episode_config, **self._sim_kwargs))
        obs, info = self._start_episode()
        if self.time_scale == "world":
            scale = world_time_scale_s(self.backend.spec, info)
            self.reward_config = replace(self._base_reward, time_scale_s=scale)
            info["time_scale_s"] = scale
        info["domain"] = {
            "cluster": self.episode_config["cluster"].name,
            "scenario": self.episode_config["scenario"].name,
            "workload": getattr(self.episode_config["workload"], "name", self.episode_config["workload"]),
        }
        return obs, info


#: The ``time`` reward's scale per world (:class:`RandomizedClusterEnv`'s ``time_scale``).
TIME_SCALES = ("fixed", "world")


def world_time_scale_s(spec, info: dict[str, Any]) -> float:
    """A simulated world's time scale after its first interval (``info`` of the reset): the wall
    time so far plus the shortest true time to the target over the global batches held from now
    on (:meth:`OracleController.held_time_s`); the episode's time budget where no batch reaches it."""
    from dynamix_gym.controllers.oracle import OracleController

    oracle = OracleController(objective="time_to_target", batch_penalty=0.0)
    oracle.reset(spec)
    held = oracle.held_time_s(info)
    if not math.isfinite(held):
        return float(spec.time_budget_s)
    return float(min(info["wall_time_s"] + held, spec.time_budget_s))
