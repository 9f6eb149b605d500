"""The real backend of the pipeline env: live stage ranks behind the simulator's interface.

:class:`RealPipelineBackend` answers what :class:`~dynamix_gym.envs.pipeline_cluster.PipelineClusterEnv`
and the pipeline controllers ask of a :class:`~sim.pipeline.simulator.PipelineSimulator`:
``reset(rng=)`` and ``run_interval(sizes, micro_batches, iterations) -> PipelineReport``, plus the
planners' view (model, stage workers, memory caps, links: its calibrated twin's, what profiling
the quiet job gives). One interval:

    pause   = 0 if the partition and M hold, else: stop the ranks at the step boundary, save every
              block's state and momentum by name, start ranks of the new cuts (measured wall time)
    slow_s  = the scenario's interference on stage s's worker at the job's clock (the same fault
              processes as the simulator: sim.faults.FaultInjector on the backend's own SimPy clock)
    run     K steps of M micro-batches of ``job.micro_batch`` samples on the ranks (rank s computing
            slow_s times longer), then the whole model's validation accuracy
    clock  += pause + the run's measured wall time   (the first start of the ranks is not counted)

Measured per stage (means over the interval's micro-batches): forward and backward compute,
``send_time_s`` = the stage's step time outside compute per micro-batch (sends, receives and
waiting for a neighbour: what a rank can see), busy and idle shares. ``truth`` is ``None``; the
emulated slow-downs are in ``events``. A lost worker is not emulated: a scenario that removes one
is refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import simpy

from adapters.real_pipeline.ranks import StagePool
from adapters.real_pipeline.twin import RealJob
from sim.faults import ClusterState, FaultInjector
from sim.pipeline.partition import bounds, check_sizes
from sim.pipeline.report import PipelineReport
from sim.pipeline.simulator import PipelineSimulator
from sim.validation import check_int


class RealPipelineBackend:
    """Stage ranks of ``job`` run as the simulator ``twin`` would be (module docstring)."""

    def __init__(self, twin: PipelineSimulator, job: RealJob, *, timeout_s: float = 120.0) -> None:
        sc = twin.scenario
        if (sc.slowdown.probability > 0 and min(sc.slowdown.factor) <= 0) or any(
            w.kind == "loss" for w in sc.windows
        ):
            raise ValueError(
                f"scenario {sc.name!r} removes workers; the real pipeline emulates slow-downs only"
            )
        if twin.num_stages != twin.cluster.num_workers:
            raise ValueError("the real pipeline runs one stage rank per worker (stages == workers)")
        self.twin, self.job, self.timeout_s = twin, job, float(timeout_s)
        # what the env and the planners read (the twin's: the quiet job's profile)
        self.model, self.cluster, self.scenario = twin.model, twin.cluster, twin.scenario
        self.num_stages, self.stage_workers, self.schedule = (
            twin.num_stages,
            twin.stage_workers,
            twin.schedule,
        )
        self.stage_cap_bytes, self.gpu_types, self.phi = twin.stage_cap_bytes, twin.gpu_types, twin.phi
        self.target_quality, self.p2p_s = twin.target_quality, twin.p2p_s
        self.expected_iteration_time_s = twin.expected_iteration_time_s
        self.memory_check, self.default_sizes = twin.memory_check, twin.default_sizes
        self.pool: StagePool | None = None
        self._env: simpy.Environment | None = None

    # --- state -------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, rng: np.random.Generator | None = None) -> None:
        """A fresh run (new ranks at the first interval): the model's init and data order from the seed."""
        self.close()
        if rng is None:
            rng = np.random.default_rng(seed)
        fault_rng, own = rng.spawn(2)  # as the simulator: faults do not depend on the controller
        self._env = simpy.Environment()
        n = self.cluster.num_workers
        self._state = ClusterState(n, np.asarray(self.scenario.worker_speed or np.ones(n), dtype=np.float64))
        FaultInjector(
            self._env, self._state, self.scenario, self.gpu_types, self.cluster.node_of_worker, fault_rng
        )
        self.run_seed = int(own.integers(2**31 - 1))
        self._t, self._steps, self._samples = 0.0, 0, 0
        self._sizes: tuple[int, ...] | None = None
        self._m: int | None = None
        self._state_blocks: dict | None = None
        self._optim: dict | None = None
        self._slow_seen: tuple[float, ...] | None = None
        self.log: list[dict] = []

    @property
    def wall_time_s(self) -> float:
        return self._t

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _restart(self, sizes: tuple[int, ...], m: int) -> float:
        """Stop the ranks (state by name), start those of ``sizes`` at ``m``; the measured pause."""
        t0 = time.perf_counter()
        if self.pool is not None:
            self._state_blocks, self._optim = self.pool.stop()
            self.pool = None
        j = self.job
        self.pool = StagePool(
            [int(x) for x in bounds(sizes)], micro_batches=m, batch=m * j.micro_batch, state=self._state_blocks,
            optim=self._optim, schedule=j.schedule, num_blocks=j.num_blocks, hidden=j.hidden, seed=self.run_seed,
            lr=j.lr, timeout_s=self.timeout_s,
        )  # fmt: skip
        return time.perf_counter() - t0

    def stage_slowdown(self) -> np.ndarray:
        st = self._state
        return np.array([max(float(st.gpu_slowdown[list(w)].max()), 1.0) for w in self.stage_workers])

    # --- one interval ------------------------------------------------------------------------------
    def run_interval(self, sizes: Sequence[int], micro_batches: int, iterations: int = 10) -> PipelineReport:
        if self._env is None:
            raise RuntimeError("call reset() before run_interval()")
        sizes = check_sizes(sizes, self.model.num_blocks)
        if len(sizes) != self.num_stages:
            raise ValueError(f"the partition has {len(sizes)} stages, the pipeline {self.num_stages}")
        M = check_int("micro_batches", micro_batches, 1, 4096)
        K = check_int("iterations", iterations, 1, 1_000_000)
        mem = self.memory_check(sizes, M)  # refused over a cap, as in the simulator
        first = self.pool is None
        pause = 0.0
        if first or (sizes, M) != (self._sizes, self._m):
            pause = self._restart(sizes, M)
            if first:
                pause = 0.0  # the job's start is not a re-partition
        repart = pause if not first and sizes != self._sizes else 0.0
        restart = pause - repart  # a change of M alone restarts the ranks too
        self._sizes, self._m = sizes, M
        self._t += pause
        while self._env.peek() <= self._t:
            self._env.step()
        slow = self.stage_slowdown()
        events = []
        if self._slow_seen != tuple(slow):
            events.append("stage slow-down " + ", ".join(f"{x:g}" for x in slow))
            self._slow_seen = tuple(slow)
        t0 = time.perf_counter()
        ran = self.pool.run(K, first_step=self._steps, slowdown=[float(x) for x in slow])
        wall = time.perf_counter() - t0
        self._t += wall
        self._steps += K
        self._samples += K * M * self.job.micro_batch
        if self._t > self._env.now:
            self._env.run(until=self._t)
        step = np.max(np.array([a["step_s"] for a in ran]), axis=0)  # a step ends when its last rank does
        f = np.array([float(np.mean(a["fwd_s"])) for a in ran])
        b = np.array([float(np.mean(a["bwd_s"])) for a in ran])
        busy = np.array([sum(a["fwd_s"]) + sum(a["bwd_s"]) for a in ran])
        per_rank_step = np.array([float(np.mean(a["step_s"])) for a in ran])
        iter_s = float(step.mean())
        interval = pause + wall
        out = np.array([self.model.output_bytes(x - 1) for x in bounds(sizes)[1:-1]])
        sent = 2.0 * out * self.model.micro_batch * M * K
        self.log.append({"t_s": self._t, "sizes": list(sizes), "micro_batches": M, "slowdown": slow.tolist(),
                         "fwd_s": f.tolist(), "bwd_s": b.tolist(), "iteration_s": iter_s, "pause_s": pause,
                         "val_accuracy": ran[-1]["val_accuracy"]})  # fmt: skip
        return PipelineReport(
            sizes=sizes,
            micro_batches=M,
            schedule=self.schedule,
            fwd_time_s=f,
            bwd_time_s=b,
            send_time_s=np.maximum(per_rank_step - M * (f + b), 0.0) / M,
            bubble_fraction=np.clip(1.0 - busy / max(K * iter_s, 1e-12), 0.0, 1.0),
            idle_fraction=np.clip(1.0 - busy / max(interval, 1e-12), 0.0, 1.0),
            gpu_util=np.clip(busy / max(wall, 1e-12), 0.0, 1.0),
            mem_util=np.clip(mem / self.stage_cap_bytes, 0.0, 1.0),
            link_bytes_per_s=sent / max(interval, 1e-12),
            iteration_time_s=iter_s,
            iterations=K,
            interval_time_s=interval,
            wall_time_s=self._t,
            repartition_time_s=repart,
            stall_time_s=restart,
            val_accuracy=float(ran[-1]["val_accuracy"]) if math.isfinite(ran[-1]["val_accuracy"]) else 0.0,
            samples=self._samples,
            events=tuple(events),
            truth=None,
        )
