"""ElasticClusterEnv: how many rented GPUs to hold, of which type and market, at which local batches
and learning rate, to reach the target accuracy for the fewest dollars."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dynamix_gym.elastic.backend import ElasticSimBackend
from dynamix_gym.elastic.pools import get_pool
from dynamix_gym.elastic.reward import ElasticRewardConfig, elastic_reward
from dynamix_gym.envs.hetero_cluster import DEFAULT_ACTION_SET, HeteroClusterEnv
from sim.elastic import LR_RANGE
from sim.pool import pool_from_dict
from sim.specs_io import spec_to_dict

ACTION_FORMS = ("dict", "multidiscrete", "box")
BATCH_ACTIONS = ("per_worker", "none")
#: A worker-count decision per offer: release 2, release 1, keep, request 1, request 2.
WORKER_DELTAS = (-2, -1, 0, 1, 2)
#: The learning-rate multipliers of the discrete (multidiscrete) form.
LR_CHOICES = (0.8, 0.9, 1.0, 1.1, 1.25)
#: Per-offer pool features and global elastic features appended to the batch env's observation.
POOL_FEATURES = ("held_fraction", "free_fraction", "price_log10_usd_per_gpu_hour", "noticed_fraction")
ELASTIC_GLOBALS = ("spend_log10_1p_usd", "cost_rate_log10_1p_usd_per_hour", "lr_multiplier", "gpus_log2")


class _ElasticTruth:
    """``job.truth_for`` for oracles, shared (not copied) when vectorised envs deep-copy infos and
    dropped when an info is pickled across processes (it holds the live simulator)."""

    def __init__(self, job) -> None:
        self._job = job

    def __call__(self, held, local_batches, progress=None) -> dict:
        return self._job.truth_for(held, local_batches, progress)

    def __deepcopy__(self, memo: dict) -> _ElasticTruth:
        return self

    def __reduce__(self):
        return (_no_truth, ())


def _no_truth() -> None:
    return None


def _to_unit(x: np.ndarray | float, lo: float, hi: float) -> np.ndarray:
    return np.clip(2.0 * (np.asarray(x, dtype=np.float64) - lo) / (hi - lo) - 1.0, -1.0, 1.0)


class ElasticClusterEnv(gym.Env):
    """
    ## Description
    Data-parallel training on GPUs rented from a pool (``sim/data/pool``: node types, GPUs available on
    demand and on the spot market, hourly prices with their source and date, spot preemptions, the
    elastic restart cost). Every step the agent sets the local batch of every slot as in
    ``dynamix/HeteroCluster-v0``, requests or releases up to 2 GPUs of each offer (node type x
    market) and sets a learning-rate multiplier; the job then trains ``interval`` iterations on the
    GPUs it holds, paying for each by the second. Any change of the held set, and every spot
    preemption (a notice, then the loss ``notice_s`` later), costs an elastic restart. The decision
    problem of the RL cloud scheduler in PRIOR_ART.md (GPUs +-1/+-2, a learning-rate nudge),
    with DYNAMIX's per-worker batches and Pollux/Sia's growing and shrinking.

    ## Action Space
    ``action_form="dict"`` (default): ``Dict(batch=..., workers=MultiDiscrete([5] * O),
    lr=Box(0.8, 1.25, (1,)))`` with O offers (``pool.offers``, e.g. T4/on_demand, T4/spot,
    V100/on_demand, V100/spot). ``workers[k]`` indexes {-2, -1, 0, +1, +2} GPUs of offer k.
    ``batch`` is the batch env's action over every slot: ``MultiDiscrete([5] * N)`` deltas
    (``batch_mode="delta"``) or ``Box(-1, 1, (N,))`` scales 1 + 0.2 a (``"continuous"``); slots
    not held keep their batch. ``batch_action="none"`` drops the batch part (batches stay at the
    initial local batch). Flat forms for Stable-Baselines3:
    ``"multidiscrete"``: ``MultiDiscrete([5] * N + [5] * O + [5])``, the last entry indexing the lr
    multipliers (0.8, 0.9, 1.0, 1.1, 1.25); ``"box"``: ``Box(-1, 1, (N + O + 1,))``: batch scales,
    worker deltas ``round(2 a)``, lr ``0.8 * (1.25 / 0.8) ** ((a + 1) / 2)`` (a = 0 is 1.0).
    The box form is what SAC and TD3 get (:data:`dynamix_gym.elastic.training.ALGO_FORM`):
    symmetric and normalised to [-1, 1] as SB3 recommends, so both env checkers pass it without a
    warning. The dict form keeps the multiplier in its own units, ``lr`` in [0.8, 1.25], and
    Gymnasium's checker warns that this Box is not normalised. It stays so: SB3 cannot train on a
    Dict action space at all (use a flat form), and a rescaled ``lr`` would silently change what
    every dict action written for the env means (``{"lr": 1.0}``, the multiplier 1 today, would
    lie in [-1, 1] and be read as 1.25).
    ``step`` takes the Dict form whatever the ``action_form`` (baselines emit it). A request beyond
    the GPUs free in the pool, or a release that would leave no GPU, is granted as far as it can
    be and listed in ``info["denied"]``; the pool's own API (``sim.elastic.ElasticJob.change``)
    raises instead.

    ## Observation Space
    ``Box(-1, 1, (19 N + 13 + 4 O + 4,), float32)``: the batch env's observation over every slot
    (its table; a slot not held has ``alive`` 0), then per offer, then globally:

    | index | name | unit | raw range |
    |---|---|---|---|
    | 19 N + 13 + 4 k + 0 | held_fraction | GPUs held / offer capacity | [0, 1] |
    | 19 N + 13 + 4 k + 1 | free_fraction | GPUs free to request / capacity | [0, 1] |
    | 19 N + 13 + 4 k + 2 | price | log10($ per GPU-hour) | [-2, 1] |
    | 19 N + 13 + 4 k + 3 | noticed_fraction | held GPUs under a preemption notice / capacity | [0, 1] |
    | 19 N + 13 + 4 O + 0 | spend | log10(1 + $ so far) | [0, 2] |
    | 19 N + 13 + 4 O + 1 | cost_rate | log10(1 + $ per hour) | [0, 2] |
    | 19 N + 13 + 4 O + 2 | lr_multiplier | multiplier | [0.8, 1.25] |
    | 19 N + 13 + 4 O + 3 | gpus | log2(GPUs held) | [0, 8] |

    ## Rewards
    ``reward="cost"`` (default): minus the interval's dollars / ``usd_scale`` (plus an optional value
    of time) plus ``target_bonus`` on reaching the target; ``reward="scheduler"``: alpha X/X_max -
    beta C/C_max + gamma dQ/Q_target - 0.1 mean((a - a_prev)^2). See
    :mod:`dynamix_gym.elastic.reward`; every term is in ``info["reward_terms"]``.

    ## Starting State
    A fresh run at time zero holding the pool's ``initial`` allocation, every slot at the initial
    local batch, lr multiplier 1; the first observation comes from one warm-up interval.

    ## Episode End
    ``terminated`` when the validation quality reaches the workload's target (``info`` then has
    ``time_to_accuracy_s`` and ``dollars_to_accuracy``); ``truncated`` at the wall-clock budget or
    ``max_decisions``. ``info["spend_usd"]`` is the spend so far at every step.

    ## Arguments
    ``gymnasium.make("dynamix/ElasticCluster-v0", pool="t4v100_spot", workload=None,
    scenario="static_hetero", reward="cost", interval=50, action_form="dict",
    batch_mode="delta", batch_action="per_worker", max_decisions=None, time_budget_s=None,
    initial_batch=None, window=4, lr_tolerance=None, lr_exponent=None, sim_kwargs=None,
    initial_allocation=None, backend=None)``; ``lr_tolerance`` and ``lr_exponent`` shape the learning-rate response
    (:mod:`sim.elastic`; ``None``: as fitted to real training, ``sim/data/lr_response.json``);
    ``initial_allocation`` (``{offer: GPUs}``) replaces the pool's ``initial``. ``backend``: any
    elastic backend with the simulated one's calls (``pool``, ``job``, ``spec``, ``run_interval``,
    ``ideal_throughput``), e.g. real ranks (:class:`adapters.elastic_job.RealElasticBackend`); the
    observation, actions and rewards are the same code whichever drives it (then the simulator's
    arguments are unused and ``info`` has no ``elastic_truth``).

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        pool: Any = "t4v100_spot",
        workload: Any = None,
        scenario: Any = "static_hetero",
        reward: str | dict | ElasticRewardConfig | None = "cost",
        interval: int = 50,
        action_form: str = "dict",
        batch_mode: str = "delta",
        batch_action: str = "per_worker",
        max_decisions: int | None = None,
        time_budget_s: float | None = None,
        initial_batch: int | None = None,
        window: int = 4,
        lr_tolerance: float | None = None,
        lr_exponent: float | None = None,
        sim_kwargs: dict[str, Any] | None = None,
        initial_allocation: Mapping[str, int] | None = None,
        backend: Any = None,
    ) -> None:
        super().__init__()
        if action_form not in ACTION_FORMS:
            raise ValueError(f"action_form={action_form!r} is not one of {list(ACTION_FORMS)}")
        if batch_mode not in ("delta", "continuous"):
            raise ValueError(f"batch_mode={batch_mode!r} is not one of ['delta', 'continuous']")
        if batch_action not in BATCH_ACTIONS:
            raise ValueError(f"batch_action={batch_action!r} is not one of {list(BATCH_ACTIONS)}")
        if action_form == "box" and batch_mode == "delta" and batch_action == "per_worker":
            batch_mode = "continuous"  # the box form scales batches continuously
        if action_form == "multidiscrete" and batch_mode == "continuous":
            raise ValueError("action_form='multidiscrete' needs batch_mode='delta'")
        pool = get_pool(backend.pool if backend is not None else pool)
        if backend is not None and initial_allocation is not None:
            raise ValueError("initial_allocation is the pool's, not the env's, when a backend is given")
        if initial_allocation is not None:
            if not isinstance(initial_allocation, Mapping):
                raise ValueError(
                    f"initial_allocation must map offers to GPU counts, got {initial_allocation!r}"
                )
            pool = pool_from_dict({**spec_to_dict(pool), "initial": dict(initial_allocation)})
        if backend is None:
            backend = ElasticSimBackend(
                pool,
                workload,
                scenario,
                initial_batch=initial_batch,
                time_budget_s=time_budget_s,
                lr_tolerance=lr_tolerance,
                lr_exponent=lr_exponent,
                **(sim_kwargs or {}),
            )
        self.backend = backend
        self.job = self.backend.job
        # The simulator's ground truth, for oracles; a real backend has none.
        self._truth = _ElasticTruth(self.job) if hasattr(self.job, "truth_for") else None
        self.pool = self.backend.pool
        # The batch env over every slot: its encoder, batch actions and clipping are reused as they are.
        self.batch_env = HeteroClusterEnv(
            backend=self.backend,
            interval=interval,
            action_mode=batch_mode,
            action_set=DEFAULT_ACTION_SET,
            max_decisions=max_decisions,
            window=window,
            reward="time",
        )
        self.reward_config = ElasticRewardConfig.from_any(reward)
        self.interval = self.batch_env.interval
        self.max_decisions = max_decisions
        self.time_budget_s = self.batch_env.time_budget_s
        self.action_form, self.batch_mode, self.batch_action = action_form, batch_mode, batch_action
        self.num_workers = n = self.backend.spec.num_workers
        self.offers = self.pool.offers
        o = len(self.offers)
        self.num_offers = o
        batch_space = self.batch_env.action_space
        dict_parts: dict[str, spaces.Space] = {}
        if batch_action == "per_worker":
            dict_parts["batch"] = batch_space
        dict_parts["workers"] = spaces.MultiDiscrete(np.full(o, len(WORKER_DELTAS), dtype=np.int64))
        dict_parts["lr"] = spaces.Box(LR_RANGE[0], LR_RANGE[1], (1,), np.float32)
        self.dict_space = spaces.Dict(dict_parts)
        nb = n if batch_action == "per_worker" else 0
        self._nb = nb
        if action_form == "dict":
            self.action_space = self.dict_space
        elif action_form == "multidiscrete":
            sizes = [len(DEFAULT_ACTION_SET)] * nb + [len(WORKER_DELTAS)] * o + [len(LR_CHOICES)]
            self.action_space = spaces.MultiDiscrete(np.array(sizes, dtype=np.int64))
        else:
            self.action_space = spaces.Box(-1.0, 1.0, (nb + o + 1,), np.float32)
        base_dim = self.batch_env.observation_space.shape[0]
        self.obs_dim = base_dim + len(POOL_FEATURES) * o + len(ELASTIC_GLOBALS)
        self.observation_space = spaces.Box(-1.0, 1.0, (self.obs_dim,), np.float32)
        self._reset_done = False
        self._episode_over = False

    # --- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.batch_env.np_random = self.np_random
        obs, info = self.batch_env._start_episode()
        self.throughput_max = self.backend.ideal_throughput()
        self.max_cost_rate = float(self.job.slot_price.sum())
        self._prev_decision = np.zeros(self.num_offers + 1)
        self._spend_prev = self.job.spend_usd()
        self._prev_quality = float(info["val_accuracy"])
        self.history: list[dict[str, Any]] = []
        self._reset_done, self._episode_over = True, False
        return self._obs(obs), self._info(info, {}, [], {})

    def step(self, action):
        if not self._reset_done:
            raise RuntimeError("ElasticClusterEnv.step() called before reset()")
        if self._episode_over:
            raise RuntimeError("the episode has ended (terminated or truncated); call reset() first")
        parts = self.to_dict_action(action)
        inner = self.batch_env
        if "batch" in parts:
            new_batches, clipped = inner.apply_action(parts["batch"])
            held = self.job.held
            inner.batches = np.where(held, new_batches, inner.batches)  # slots not held keep theirs
            clipped = [c for c in clipped if held[c["worker"]]]
        else:
            clipped = []
        deltas = np.asarray(WORKER_DELTAS)[np.asarray(parts["workers"], dtype=np.int64)]
        granted, denied = self._grant(deltas)
        changed = self.job.change(granted) if np.any(granted) else {"added": [], "removed": []}
        lr = float(np.asarray(parts["lr"]).reshape(-1)[0])
        self.job.set_lr_multiplier(lr)
        report = self.backend.run_interval(inner.batches, self.interval)
        out = inner._observe(report)  # the batch env's decision step: encoding and the episode's end
        terminated, truncated = out.terminated, out.truncated
        spec = self.backend.spec
        spend = self.job.spend_usd()
        cost = spend - self._spend_prev
        self._spend_prev = spend
        decision = np.concatenate([granted / 2.0, [math.log(lr) / math.log(LR_RANGE[1])]])
        reward, terms = elastic_reward(
            self.reward_config,
            report,
            cost_usd=cost,
            max_cost_rate_usd_per_hour=self.max_cost_rate,
            throughput_max=self.throughput_max,
            quality_gain=max(0.0, float(report.val_accuracy) - self._prev_quality),
            target_quality=spec.target_accuracy,
            decision=decision,
            prev_decision=self._prev_decision,
            reached_target=terminated,
        )
        self._prev_decision = decision
        self._prev_quality = float(report.val_accuracy)
        self._episode_over = terminated or truncated
        info = self._info(inner._info(report, clipped, terms), changed, denied, terms)
        if terminated:
            info["time_to_accuracy_s"] = report.wall_time_s
            info["dollars_to_accuracy"] = spend
        return self._obs(inner._obs()), reward, terminated, truncated, info

    def close(self) -> None:
        self.backend.close()

    # --- actions ---------------------------------------------------------------------------------------
    def to_dict_action(self, action) -> dict[str, Any]:
        """The Dict form of ``action`` (given in the Dict form or in this env's flat form).

        Raises:
            ValueError: an action outside the space, naming the part and its allowed range.
        """
        if isinstance(action, Mapping):
            keys = set(self.dict_space.spaces)
            if set(action) != keys:
                raise ValueError(f"a dict action needs exactly the keys {sorted(keys)}, got {sorted(action)}")
            w = np.asarray(action["workers"])
            if w.shape != (self.num_offers,) or w.dtype.kind not in "iu" or w.min() < 0 or w.max() >= 5:
                raise ValueError(
                    f"action['workers'] must be {self.num_offers} integers in [0, 4] (indices of "
                    f"{list(WORKER_DELTAS)} per offer {list(self.offers)}), got {w.tolist()}"
                )
            lr = float(np.asarray(action["lr"]).reshape(-1)[0])
            if not LR_RANGE[0] <= lr <= LR_RANGE[1]:
                raise ValueError(
                    f"action['lr'] (learning-rate multiplier) must lie in {list(LR_RANGE)}, got {lr}"
                )
            out = {"workers": w, "lr": lr}
            if "batch" in action:
                out["batch"] = np.asarray(action["batch"])
            return out
        a = np.asarray(action)
        if a.shape != self.action_space.shape or not self.action_space.contains(
            a.astype(self.action_space.dtype)
        ):
            raise ValueError(f"action {a.tolist()} is outside the action space {self.action_space}")
        nb, o = self._nb, self.num_offers
        out: dict[str, Any] = {}
        if self.action_form == "multidiscrete":
            if nb:
                out["batch"] = a[:nb].astype(np.int64)
            out["workers"] = a[nb : nb + o].astype(np.int64)
            out["lr"] = LR_CHOICES[int(a[-1])]
        else:
            if nb:
                out["batch"] = a[:nb].astype(np.float64)
            out["workers"] = np.rint(2.0 * a[nb : nb + o].astype(np.float64)).astype(np.int64) + 2
            out["lr"] = float(LR_RANGE[0] * (LR_RANGE[1] / LR_RANGE[0]) ** ((float(a[-1]) + 1.0) / 2.0))
        return out

    def _grant(self, deltas: np.ndarray) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """What the pool can grant of ``deltas`` (requests up to the free GPUs, releases up to the
        held ones, at least one GPU left in all) and the list of what it could not."""
        held, free = self.job.held_counts(), self.job.free_counts()
        granted = np.clip(deltas, -held, free).astype(np.int64)
        total = int(held.sum() + granted.sum())
        # Keep at least one GPU: undo releases, the last offer's first.
        for k in range(self.num_offers - 1, -1, -1):
            if total >= 1:
                break
            if granted[k] < 0:
                back = min(-int(granted[k]), 1 - total)
                granted[k] += back
                total += back
        denied = [
            {"offer": self.offers[k], "requested": int(deltas[k]), "granted": int(granted[k])}
            for k in range(self.num_offers)
            if granted[k] != deltas[k]
        ]
        return granted, denied

    # --- observation and info --------------------------------------------------------------------------
    def _obs(self, base: np.ndarray) -> np.ndarray:
        cap = np.maximum(self.job.capacity, 1)
        per_offer = np.stack(
            [
                _to_unit(self.job.held_counts() / cap, 0.0, 1.0),
                _to_unit(self.job.free_counts() / cap, 0.0, 1.0),
                _to_unit(np.log10(np.maximum(self.job.offer_price, 1e-3)), -2.0, 1.0),
                _to_unit(self.job.noticed_counts() / cap, 0.0, 1.0),
            ],
            axis=1,
        ).reshape(-1)
        glob = np.array(
            [
                _to_unit(math.log10(1.0 + self.job.spend_usd()), 0.0, 2.0),
                _to_unit(math.log10(1.0 + self.job.cost_rate_usd_per_hour()), 0.0, 2.0),
                _to_unit(self.job.lr_multiplier, *LR_RANGE),
                _to_unit(math.log2(max(int(self.job.held.sum()), 1)), 0.0, 8.0),
            ]
        )
        return np.concatenate([base, per_offer, glob]).astype(np.float32)

    def _info(self, base: dict, changed: dict, denied: list, terms: dict) -> dict[str, Any]:
        info = dict(base)
        events = [str(e) for e in self.job.new_events()]
        if self._truth is not None:
            info["elastic_truth"] = self._truth  # simulation only: for oracles
        info.update(
            reward_terms=terms,
            spend_usd=self.job.spend_usd(),
            cost_rate_usd_per_hour=self.job.cost_rate_usd_per_hour(),
            held=self.job.held,
            available=self.job.available & ~self.job.held,
            held_counts=dict(zip(self.offers, self.job.held_counts().tolist(), strict=True)),
            free_counts=dict(zip(self.offers, self.job.free_counts().tolist(), strict=True)),
            noticed_counts=dict(zip(self.offers, self.job.noticed_counts().tolist(), strict=True)),
            lr_multiplier=self.job.lr_multiplier,
            restarts=self.job.restarts,
            changed=changed,
            denied=denied,
            pool_events=events,
        )
        self.history.append(
            {
                "wall_time_s": float(info["wall_time_s"]),
                "val_accuracy": float(info["val_accuracy"]),
                "spend_usd": info["spend_usd"],
                "gpus": int(self.job.held.sum()),
                **{f"held_{k}": v for k, v in info["held_counts"].items()},
                "lr_multiplier": self.job.lr_multiplier,
            }
        )
        return info
