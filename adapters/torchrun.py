"""The drop-in controller: DYNAMIX batch-size control inside an existing DDP training loop.

Add it to a script launched by ``torchrun`` (one node or several, c10d rendezvous); no extra
service runs anywhere::

    ctl = DynamixController(ddp_model, optimizer, policy="dlb", interval=50, evaluate=my_eval)
    loader = DataLoader(dataset, batch_sampler=ctl.batch_sampler(len(dataset)))
    for x, y in loader:
        ctl.begin()
        out = ddp_model(x)
        loss = F.cross_entropy(out, y, reduction="sum")
        (loss * ctl.loss_scale).backward()            # W / B: the global-batch mean gradient
        optimizer.step(); optimizer.zero_grad()
        ctl.end(loss.detach(), (out.argmax(1) == y).sum())
        if ctl.done:
            break

Every rank times its iterations. On every ``stats_every``-th iteration the controller also keeps
that iteration's backward local (as ``DDP.no_sync`` does) and, in an ``optimizer.step`` pre-hook,
times the local compute, takes the local gradient norm, all-reduces the gradient in one flat bucket
(DDP's arithmetic: sum / W) and takes the all-reduced norm; the other iterations run DDP untouched,
so the controller adds no work to them. Every ``interval`` iterations one
``all_gather`` brings the measurements to rank 0, which builds the same
:class:`~sim.protocol.IntervalReport` the env sees and decides with the env's own decision step
(:class:`adapters.dropin.DropInDecider` over :class:`dynamix_gym.decision.DecisionStep`: the same
observation, action modes, clipping, split and end conditions), the policy being a baseline
controller, a PPO bundle or the arbitrator. One ``broadcast``
hands every rank the new batches, the scaled learning rate and the stop flag, so every rank
changes its batch at the same step boundary.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from adapters.dropin import DropInDecider
from adapters.hostmetrics import HostSnapshot, ProcessMeter
from adapters.sampling import DynamicBatchSampler, loss_weight
from adapters.snapshot import StateSnapshot
from dynamix_gym.controllers.base import Controller
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.stats import NoiseScaleEstimator
from sim.guards import Guard, GuardConfig, LRRamp
from sim.protocol import BackendSpec, IntervalReport
from sim.scaling import lr_gain
from sim.workloads import ACCURACY, QualityMetric

#: The guards' order to every rank at a decision (sim.guards.Guard.observe): keep, snapshot, roll back.
_KEEP, _SNAPSHOT, _ROLLBACK = 0.0, 1.0, 2.0

#: Per-rank scalars gathered at each interval boundary, after 2 K per-iteration times.
_SCALARS = (
    "batch",
    "iter_s",
    "samples",
    "correct",
    "loss_sum",
    "grad_norm_mean",
    "grad_norm_var",
    "local_sqr",
    "global_sqr",
    "cpu_util",
    "mem_util",
    "bytes_sent",
    "retrans",
    "val_acc",
    "val_loss",
    "gpu_util",
)


def _total(values: list[Any]) -> float:
    """Sum of floats or (0-dim) tensors, with one device sync."""
    if values and isinstance(values[0], torch.Tensor):
        return float(torch.stack([v.reshape(()) for v in values]).sum())
    return float(sum(values))


class DynamixController:
    """Batch-size control for a ``DistributedDataParallel`` loop; construct it on every rank.

    Args:
        ddp_model: the user's DDP model.
        optimizer: its optimiser; the learning rate is set at every decision (``lr_rule``), and a
            step pre-hook does the measured iterations' all-reduce. Not for loops that may skip
            ``optimizer.step()`` (AMP's ``GradScaler`` after an overflow): that all-reduce would
            be skipped on some ranks.
        policy: a controller object, a baseline name or a PPO bundle path (used on rank 0 only).
        arbitrator: ``host:port`` of an arbitrator service (``python -m experiments.serve``) to ask
            instead of an in-process policy; when it is slow or down the job keeps its batches and
            rank 0 warns (:class:`dynamix_gym.service.client.RemoteController`); when it refuses the
            job (wrong token, unknown bundle) rank 0 raises the cause, unless
            ``arbitrator_kwargs["allow_without_policy"]``. ``token`` (else ``token_file``, else
            ``$DYNAMIX_ARBITRATOR_TOKEN``) authenticates; ``arbitrator_kwargs`` go to the client
            (job_id, timeout_s, backoff_s, ca_file, task, bundle, allow_without_policy).
            :attr:`decisions_without_policy` counts the decisions made without it.
        policy_kwargs: arguments of the baseline named by ``policy``.
        interval: K, iterations per decision.
        base_batch: M0; ``base_lr`` (default: the optimiser's current lr) is the lr at M0.
        min_batch: per-rank lower limit (scalar or one per rank).
        max_batch: per-rank upper limit (scalar or one per rank).
        initial_batch: per-rank first batch (scalar or one per rank).
        lr_rule: adascale | linear | sqrt | none (``sim.scaling``).
        evaluate: called on every rank at each decision, returns (val_accuracy, val_loss); rank 0's
            values are used. ``None``: the interval's training accuracy and loss stand in.
        target_accuracy: ``done`` turns true when it is reached (or ``time_budget_s`` is).
        time_budget_s: ``done`` turns true when it is reached (or ``target_accuracy`` is).
        metric: the validation metric; a falling one makes the accuracies qualities (examples/torchrun_lm.py).
        gpu_types: names for the spec (default: the device type per rank).
        slowdown: this rank's emulated compute multiplier (>= 1; CPU demos of a slow GPU).
        stats_every: measure every n-th iteration (gradient norms, compute / wait split); the
            others run DDP untouched and only their wall time is taken. Interval means stay
            unbiased and the per-iteration cost drops n-fold.
        guards: :class:`sim.guards.GuardConfig`, its fields or a mode name (default: on): the capped,
            ramped learning rate and the watchdog that rolls every rank back to its last good snapshot
            (model, optimiser, :meth:`batch_sampler`'s position, batches, rate); state the loop keeps
            itself (its own scheduler, an AMP scaler) is not rolled back.
    """

    def __init__(
        self,
        ddp_model: torch.nn.parallel.DistributedDataParallel,
        optimizer: torch.optim.Optimizer,
        policy: Controller | str | Path | None = None,
        *,
        arbitrator: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
        arbitrator_kwargs: dict[str, Any] | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        interval: int = 50,
        base_batch: int = 32,
        min_batch: int | list[int] = 8,
        max_batch: int | list[int] = 512,
        initial_batch: int | list[int] | None = None,
        base_lr: float | None = None,
        lr_rule: str = "adascale",
        evaluate: Callable[[], tuple[float, float]] | None = None,
        target_accuracy: float = 1.0,
        time_budget_s: float = math.inf,
        num_classes: int = 10,
        metric: QualityMetric = ACCURACY,
        workload: str = "user",
        gpu_types: tuple[str, ...] | None = None,
        slowdown: float = 1.0,
        stats_every: int = 8,
        seed: int = 0,
        guards: GuardConfig | dict[str, Any] | str | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("DynamixController needs an initialised process group (run under torchrun)")
        if interval < 1:
            raise ValueError(f"interval (K) must be >= 1, got {interval}")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.interval = int(interval)
        self.optimizer = optimizer
        self.base_lr = float(base_lr if base_lr is not None else optimizer.param_groups[0]["lr"])
        self.base_batch = int(base_batch)
        self.lr_rule = lr_rule
        self.evaluate = evaluate
        self.slowdown = float(slowdown)
        if stats_every < 1:
            raise ValueError(f"stats_every must be >= 1, got {stats_every}")
        self.stats_every = int(stats_every)
        self.cuda = next(ddp_model.parameters()).is_cuda
        self.comm_device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        self.model = ddp_model
        self._params = [p for p in ddp_model.parameters() if p.requires_grad]
        self._measuring = False
        self._compute_est = 0.0  # last measured local compute (emulated slow-down between measurements)
        self._pre_step_handle = optimizer.register_step_pre_hook(self._pre_step)

        def per_rank(v: int | list[int] | None) -> np.ndarray:
            v = base_batch if v is None else v
            arr = (
                np.full(self.world, int(v), dtype=np.int64)
                if np.isscalar(v)
                else np.asarray(v, dtype=np.int64)
            )
            if arr.shape != (self.world,):
                raise ValueError(f"per-rank batch lists need {self.world} entries, got {list(v)}")
            return arr

        self.batches = per_rank(initial_batch)
        self.spec = BackendSpec(
            gpu_types=tuple(gpu_types) if gpu_types else ("cuda" if self.cuda else "cpu",) * self.world,
            node_of_worker=self._node_of_worker(),
            min_batch=per_rank(min_batch),
            max_batch=per_rank(max_batch),
            initial_batch=self.batches.copy(),
            base_batch=self.base_batch,
            target_accuracy=float(target_accuracy),
            time_budget_s=float(time_budget_s),
            num_classes=int(num_classes),
            workload=workload,
            deterministic=False,
            metric=metric,
            lr_rule=lr_rule,
        )
        self.guard = Guard(guards)
        #: the learning-rate rule's noise-scale estimate, from the intervals after the run's first
        #: (the guards' ``lr_gain_warmup``: the first one's overshoots)
        self.noise = NoiseScaleEstimator()
        self.ramp = LRRamp(self.guard.config.ramp_iters())
        self.snapshot = StateSnapshot()  # every rank's last good training state (the guards')
        self._sampler: DynamicBatchSampler | None = None
        #: rank 0: the policy, the guards' fallback and the env's decision step (adapters.dropin)
        self.decider: DropInDecider | None = None
        if self.rank == 0:
            if arbitrator:
                from dynamix_gym.service.client import RemoteController

                kw = {"job_id": f"torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}"}
                kw.update(arbitrator_kwargs or {})
                chosen: Controller = RemoteController(
                    arbitrator, interval=self.interval, token=token, token_file=token_file, **kw
                )
            elif policy is None:
                raise ValueError("DynamixController needs policy=<controller, name or bundle> or arbitrator=")
            else:
                chosen = (
                    make_controller(policy, **(policy_kwargs or {}))
                    if isinstance(policy, str | Path)
                    else policy
                )
            self.decider = DropInDecider(self.spec, self.guard, chosen, seed)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.meter = ProcessMeter(ranks_on_host=local_world)
        self.local_world = local_world
        self.done = False
        self.decisions = 0
        self.last_report: IntervalReport | None = None
        self.overhead_s = 0.0  # time spent in decisions (gather, policy, broadcast), this rank
        #: seconds spent per part of the decisions, this rank (the gather includes waiting for peers)
        self.timings = {"measure": 0.0, "gather": 0.0, "policy": 0.0, "broadcast": 0.0}
        self._set_lr(self._lr_for(self.batches))
        self._t_run = time.perf_counter()
        self._new_interval()

    # --- what the training loop reads --------------------------------------------------------------
    @property
    def policy(self) -> Controller | None:
        """Rank 0: the policy (None on the other ranks)."""
        return None if self.decider is None else self.decider.policy

    @property
    def inputs_out_of_range(self) -> str:
        """Rank 0: the policy bundle's inputs read far out of its training range so far, most often
        first (:meth:`dynamix_gym.controllers.bundle.PPOController.out_of_range_text`; empty for
        another policy, and on the other ranks)."""
        text = getattr(self.policy, "out_of_range_text", None)
        return text() if callable(text) else ""

    @property
    def decisions_without_policy(self) -> int:
        """Rank 0: decisions at which the batches were kept because the arbitrator refused the job or
        did not answer (0 for an in-process policy, and on the other ranks)."""
        return int(getattr(self.policy, "decisions_without_policy", 0))

    @property
    def local_batch(self) -> int:
        return int(self.batches[self.rank])

    @property
    def loss_scale(self) -> float:
        """W / B: multiply the *summed* per-sample loss by this before ``backward``."""
        return self._loss_scale

    def batch_sampler(self, n: int, seed: int = 0, steps: int | None = None) -> DynamicBatchSampler:
        """A ``DataLoader`` batch sampler that follows this controller's batches (shared permutation);
        the guards roll its position back with the model."""
        self._sampler = DynamicBatchSampler(n, self.rank, lambda: self.batches, seed=seed, steps=steps)
        return self._sampler

    # --- per iteration --------------------------------------------------------------------------------
    def begin(self) -> None:
        """Call at the start of each iteration (before the forward pass)."""
        if self.ramp.done < self.ramp.iters:  # a learning-rate change under way (sim.guards.LRRamp)
            self._apply_lr(self.ramp.next())
        self._measuring = self._k % self.stats_every == 0
        if self._measuring:
            # This iteration's backward stays local (what ``DDP.no_sync`` does); the optimiser's
            # step pre-hook then measures the local gradient and all-reduces it.
            self.model.require_backward_grad_sync = False
        self._t0 = time.perf_counter()

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Before ``optimizer.step()``: on measured iterations, time the local compute, take the
        local and all-reduced gradient norms and do DDP's all-reduce (one flat bucket)."""
        if not self._measuring:
            if self.slowdown > 1.0:  # emulated slow device: as slow as last measured
                extra = (self.slowdown - 1.0) * self._compute_est
                time.sleep(extra)
                self._injected += extra
            return
        if self.cuda:
            torch.cuda.synchronize()
        t_ready = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = torch._utils._flatten_dense_tensors(grads)
        local_sqr = float(torch.dot(flat, flat))
        compute = t_ready - self._t0
        injected = 0.0
        if self.slowdown > 1.0:
            injected = (self.slowdown - 1.0) * compute
            time.sleep(injected)
            self._injected += injected
        t_sent = time.perf_counter()
        flat.div_(self.world)
        dist.all_reduce(flat)
        for p, g, reduced in zip(
            self._params, grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True
        ):
            if p.grad is None:
                p.grad = reduced.clone()
            else:
                g.copy_(reduced)
        if self.cuda:
            torch.cuda.synchronize()
        t_reduced = time.perf_counter()
        self.model.require_backward_grad_sync = True
        j = self._m
        self._compute_est = compute
        self._compute[j] = compute + injected
        self._wait[j] = t_reduced - t_sent
        self._busy += compute + injected  # an emulated slower device is busy for longer
        self._local_sqr[j] = local_sqr * self._to_local
        self._global_sqr[j] = float(torch.dot(flat, flat))
        self._m += 1

    def end(self, loss_sum: torch.Tensor | float, correct: torch.Tensor | int) -> bool:
        """Call after ``optimizer.step()``; returns True when a new decision took effect."""
        if self._measuring:
            if self.model.require_backward_grad_sync is False:
                self.model.require_backward_grad_sync = True
                raise RuntimeError("DynamixController.end(): optimizer.step() was not called since begin()")
            if self.cuda:
                torch.cuda.synchronize()
        self._iter[self._k] = time.perf_counter() - self._t0
        self._losses.append(loss_sum)  # summed at the decision: no tensor op per iteration
        self._corrects.append(correct)
        self._k += 1
        if self._k < self.interval:
            return False
        return self._decide()

    # --- at interval boundaries ---------------------------------------------------------------------
    def _node_of_worker(self) -> tuple[int, ...]:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        return tuple(r // max(local, 1) for r in range(self.world))

    def _measured_iters(self) -> np.ndarray:
        return np.arange(0, self.interval, self.stats_every)

    def _new_interval(self) -> None:
        k = self.interval
        self._k = 0
        self._m = 0  # iterations with gradient norms taken
        b = self.local_batch
        self._to_local = (int(self.batches.sum()) / (self.world * b)) ** 2 if b > 0 else 0.0
        self._loss_scale = loss_weight(self.batches)
        self._compute = np.zeros(k)
        self._wait = np.zeros(k)
        self._iter = np.zeros(k)
        self._local_sqr = np.zeros(k)
        self._global_sqr = np.zeros(k)
        self._busy = 0.0
        self._injected = 0.0  # emulated slowness slept this interval (busy time of a slower device)
        self._losses: list[Any] = []
        self._corrects: list[Any] = []
        self._t_interval = time.perf_counter()
        self._snap = HostSnapshot.take()
        self.meter.mark()

    def _lr_for(self, batches: np.ndarray) -> float:
        gain = lr_gain(self.lr_rule, int(batches.sum()), self.base_batch, self.noise.noise_scale)
        return self.base_lr * self.guard.config.lr_gain(gain) * self.guard.lr_scale

    def _set_lr(self, lr: float) -> None:
        """The learning rate the rule asks for; the optimiser gets there over the guards' ramp."""
        self.lr = lr
        self.ramp.set_target(lr, int(self.batches.sum()))
        self._apply_lr(self.ramp.current)

    def _apply_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def _decide(self) -> bool:
        t0 = time.perf_counter()
        k = self.interval
        val_acc, val_loss = self.evaluate() if self.evaluate is not None else (math.nan, math.nan)
        t_eval = time.perf_counter() - t0
        cpu, mem = self.meter.read(extra_busy_s=0.0 if self.cuda else self._injected)
        seconds, sent, retrans = self._snap.delta(HostSnapshot.take())
        m = max(self._m, 1)
        local_sqr, global_sqr = self._local_sqr[:m], self._global_sqr[:m]
        gnorm = np.sqrt(local_sqr)
        samples = self.local_batch * k
        scalars = {
            "batch": self.local_batch,
            "iter_s": float(self._iter.mean()),
            "samples": samples,
            "correct": _total(self._corrects),
            "loss_sum": _total(self._losses),
            "grad_norm_mean": float(gnorm.mean()),
            "grad_norm_var": float(gnorm.var()),
            "local_sqr": float(local_sqr.mean()),
            "global_sqr": float(global_sqr.mean()),
            "cpu_util": cpu,
            "mem_util": mem,
            "bytes_sent": sent / self.local_world / max(seconds, 1e-9),
            "retrans": retrans / self.local_world,
            "val_acc": float(val_acc),
            "val_loss": float(val_loss),
            "gpu_util": min(self._busy / max(float(self._iter[self._measured_iters()].sum()), 1e-12), 1.0),
        }
        mine = np.concatenate([self._compute, self._wait, np.array([scalars[s] for s in _SCALARS])])
        local = torch.from_numpy(mine).to(self.comm_device)
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        t_gather = time.perf_counter()
        dist.all_gather(gathered, local)
        t_policy = time.perf_counter()
        interval_s = time.perf_counter() - self._t_interval
        decision = torch.zeros(self.world + 3, dtype=torch.float64, device=self.comm_device)
        if self.rank == 0:
            rows = torch.stack(gathered).cpu().numpy()
            report = self._report(rows, interval_s)
            self.last_report = report
            if self.decisions >= self.guard.config.gain_warmup():  # decisions: intervals run so far
                self.noise.update(report)
            new, stop, verdict = self.decider.decide(report, self.batches, self.decisions)
            if verdict == "snapshot":  # the guards' snapshot and rollback of the noise estimate
                self._snapshot_noise = (self.noise.grad_sqr, self.noise.trace_sigma)
            elif verdict == "rollback":
                self.noise.grad_sqr, self.noise.trace_sigma = self._snapshot_noise
            decision[: self.world] = torch.from_numpy(new.astype(np.float64))
            decision[self.world] = self._lr_for(new)
            decision[self.world + 1] = float(stop)
            decision[self.world + 2] = {"snapshot": _SNAPSHOT, "rollback": _ROLLBACK}.get(verdict, _KEEP)
        t_bcast = time.perf_counter()
        dist.broadcast(decision, src=0)
        t_done = time.perf_counter()
        tm = self.timings
        tm["measure"] += t_gather - t0 - t_eval
        tm["gather"] += t_policy - t_gather
        tm["policy"] += t_bcast - t_policy
        tm["broadcast"] += t_done - t_bcast
        d = decision.cpu().numpy()
        self._carry_out(d[self.world + 2])
        new = d[: self.world].astype(np.int64)
        changed = bool(np.any(new != self.batches))
        self.batches = new
        self._set_lr(float(d[self.world]))
        self.done = bool(d[self.world + 1])
        self.decisions += 1
        self.overhead_s += time.perf_counter() - t0 - t_eval
        self._new_interval()
        return changed

    # --- the guards (sim.guards; rank 0 judges in adapters.dropin) -------------------------------------
    def _carry_out(self, order: float) -> None:
        """Every rank: keep a snapshot of its training state, or go back to it."""
        if order == _SNAPSHOT:
            self.snapshot.save(
                {
                    "model": self.model.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "sampler": self._sampler.schedule.state_dict() if self._sampler is not None else None,
                }
            )
        elif order == _ROLLBACK:
            snap = self.snapshot.load()
            self.model.module.load_state_dict(snap["model"])
            self.optimizer.load_state_dict(snap["optimizer"])
            if snap["sampler"] is not None:
                self._sampler.schedule.load_state_dict(snap["sampler"])
            self.ramp = LRRamp(self.ramp.iters)  # the restored rate is set at once, not ramped to

    def _report(self, rows: np.ndarray, interval_s: float) -> IntervalReport:
        k, m = self.interval, max(self._m, 1)  # every rank measured the same m iterations
        compute, wait = rows[:, :m], rows[:, k : k + m]
        s = {name: rows[:, 2 * k + i] for i, name in enumerate(_SCALARS)}
        b = s["batch"].astype(np.int64)
        val_acc, val_loss = float(s["val_acc"][0]), float(s["val_loss"][0])
        if math.isnan(val_acc):  # no evaluate(): the interval's training accuracy and loss stand in
            denom = np.maximum(s["samples"], 1.0)
            val_acc = float(s["correct"].sum() / denom.sum())
            val_loss = float(s["loss_sum"].sum() / denom.sum())
        return IntervalReport.from_rank_timings(
            local_batch=b,
            alive=np.ones(self.world, dtype=bool),
            compute_s=compute,
            wait_s=wait,
            iteration_time_s=s["iter_s"],
            iterations=k,
            interval_time_s=interval_s,
            rank_samples=s["samples"],
            correct=s["correct"],
            loss_sum=s["loss_sum"],
            grad_norm_mean=s["grad_norm_mean"],
            grad_norm_var=s["grad_norm_var"],
            local_grad_sqr=s["local_sqr"],
            net_bytes_per_s=s["bytes_sent"],
            tcp_retransmissions=s["retrans"],
            cpu_util=s["cpu_util"],
            mem_util=s["mem_util"],
            gpu_util=s["gpu_util"],
            gpu_mem_util=np.zeros(self.world),
            wall_time_s=time.perf_counter() - self._t_run,
            reconfig_time_s=0.0,
            global_grad_sqr=float(s["global_sqr"][0]),
            val_accuracy=val_acc,
            val_loss=max(val_loss, 0.0),
            epoch=0.0,
        )

    # --- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Batches, learning rate, noise estimate and (rank 0) the policy and observation history."""
        state = {
            "batches": self.batches.tolist(),
            "lr": self.lr,
            "noise": (self.noise.grad_sqr, self.noise.trace_sigma),
            "decisions": self.decisions,
        }
        if self.rank == 0:
            state["policy"] = self.decider.policy
            state["encoder"] = self.decider.step.encoder
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint, also one written at another world size (a ``torchrun --nnodes=1:N``
        elastic restart): the global batch is then kept and split evenly over the new ranks, and
        the policy's per-worker history, which belongs to the old ranks, starts afresh."""
        batches = np.asarray(state["batches"], dtype=np.int64)
        resized = batches.shape != (self.world,)
        if resized:
            base, extra = divmod(int(batches.sum()), self.world)
            even = np.array([base + (1 if r < extra else 0) for r in range(self.world)], dtype=np.int64)
            batches = np.clip(even, self.spec.min_batch, self.spec.max_batch)
        self.batches = batches
        self.ramp = LRRamp(self.ramp.iters)  # a resumed run takes its learning rate at once
        self._set_lr(float(state["lr"]))
        self.noise.grad_sqr, self.noise.trace_sigma = state["noise"]
        self.decisions = int(state["decisions"])
        if self.rank == 0 and "policy" in state and not resized:
            self.decider.policy = state["policy"]
            self.decider.step.encoder = state["encoder"]
        self._new_interval()
