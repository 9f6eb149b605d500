"""``dynamix/RealPipeline-v1``: the unchanged pipeline env over live CPU gloo stage ranks.

:class:`RealPipelineEnv` is :class:`~dynamix_gym.envs.pipeline_cluster.PipelineClusterEnv` (the
same protocol, observation table, masks and reward code) whose episodes run on a
:class:`~adapters.real_pipeline.backend.RealPipelineBackend` instead of the simulator; the
simulator of the same job, calibrated from the ranks (:mod:`adapters.real_pipeline.twin`), is what
``simulator_for`` gives the planners. A controller or policy cannot tell which env it drives
except by the numbers. Build and run it under ``if __name__ == "__main__":`` (the ranks are
spawned processes); ``close()`` ends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adapters.real_pipeline.backend import RealPipelineBackend
from adapters.real_pipeline.twin import (
    RealJob,
    burst_scenario,
    cpu_cluster,
    load_calibration,
    twin_kwargs,
    twin_model,
)
from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from sim.faults import Scenario
from sim.pipeline.simulator import PipelineSimulator


class RealPipelineEnv(PipelineClusterEnv):
    """The pipeline env on real stage ranks (module docstring).

    Args:
        scenario: the emulated faults (a :class:`~sim.faults.Scenario` or preset; default an
            interference burst x4 on stage rank 0 from 5 s, :func:`~adapters.real_pipeline.twin.burst_scenario`).
        job: the real job (:class:`~adapters.real_pipeline.twin.RealJob`, or a dict of its fields).
        ranks: stage ranks (one stage each).
        calibration: the twin's calibration (a dict; ``None``: the shipped ``sim/data`` file).
        target_quality: validation accuracy on the digits' held-out rows that ends an episode.
        interval: steps per decision (K); with ``interval_s``, the most.
        interval_s: seconds a decision interval should last (K follows the iteration time, at most
            ``interval``); ``None`` (the default): always K, so every controller validates at the same
            steps and, at a fixed M, reaches the target at the same step.
        timeout_s: bound of every wait on the ranks.
        **kwargs: as :class:`PipelineClusterEnv` (``max_stages`` and ``micro_batch_set`` keep the
            simulated env's defaults so that one policy drives both).
    """

    def __init__(
        self,
        scenario: str | Scenario | None = None,
        *,
        job: RealJob | dict | None = None,
        ranks: int = 2,
        calibration: dict | None = None,
        target_quality: float = 0.9,
        interval: int = 4,
        interval_s: float | None = None,
        time_budget_s: float = 1800.0,
        max_decisions: int = 2000,
        max_stages: int = 8,
        micro_batch_set: Sequence[int] = (4, 8, 16, 32),
        timeout_s: float = 120.0,
        **kwargs: Any,
    ) -> None:
        self.job = job if isinstance(job, RealJob) else RealJob(**(job or {}))
        self.calibration = calibration if calibration is not None else load_calibration()
        self.timeout_s = float(timeout_s)
        cal = self.calibration
        super().__init__(
            cpu_cluster(ranks), twin_model(self.job, cal), scenario if scenario is not None else burst_scenario(),
            stages=ranks, schedule=self.job.schedule, interval=interval, interval_s=interval_s,
            max_stages=max_stages, micro_batch_set=micro_batch_set, target_quality=target_quality,
            time_budget_s=time_budget_s, max_decisions=max_decisions,
            simulator_kwargs=twin_kwargs(self.job, cal, ranks),
            **kwargs,
        )  # fmt: skip

    def _backend(self, sim: PipelineSimulator) -> RealPipelineBackend:
        if isinstance(self.sim, RealPipelineBackend):
            self.sim.close()  # a new episode: the last one's ranks end
        return RealPipelineBackend(sim, self.job, timeout_s=self.timeout_s)


def make_real_pipeline_env(**kwargs: Any) -> RealPipelineEnv:
    """The registered entry point of ``dynamix/RealPipeline-v1`` (and ``-v0``: ``move_gains=False``)."""
    from adapters.ddp_env import check_main_guard

    check_main_guard()
    return RealPipelineEnv(**kwargs)
