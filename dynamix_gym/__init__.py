"""dynamix-gym: DYNAMIX's per-worker batch-size control as a Gymnasium environment.

Importing the package registers:

* ``dynamix/HeteroCluster-v0``: the centralised env over the simulator (or any backend);
  ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`` builds its batched vector env
  (:class:`~dynamix_gym.envs.batched_vector.BatchedClusterVectorEnv`);
* ``dynamix/HeteroClusterPerWorker-v0``: the same cluster, one worker's decision per step;
* ``dynamix/RealDDP-v0``: the centralised env over real PyTorch DDP training (``adapters``);
* ``dynamix/ElasticCluster-v0``: GPUs rented from a priced pool, held, released and preempted;
* ``dynamix/PipelineCluster-v1``: where to cut a pipeline-parallel model, under interference
  (``-v0``: its observation without the move gains);
* ``dynamix/RealPipeline-v1``: the same env over real CPU gloo stage ranks (``adapters``; ``-v0`` too).
"""

from gymnasium.envs.registration import register, registry

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.per_worker import PerWorkerEnv
from dynamix_gym.obs import DEFAULT_SCHEMA_VERSION, OBS_SCHEMA, SCHEMA_VERSIONS, ObservationEncoder
from dynamix_gym.reward import RewardConfig, compute_reward
from sim.protocol import Backend, BackendSpec, IntervalReport

__all__ = [
    "DEFAULT_SCHEMA_VERSION",
    "OBS_SCHEMA",
    "SCHEMA_VERSIONS",
    "Backend",
    "BackendSpec",
    "HeteroClusterEnv",
    "IntervalReport",
    "ObservationEncoder",
    "PerWorkerEnv",
    "RewardConfig",
    "compute_reward",
]

_ENVS = {
    "dynamix/HeteroCluster-v0": "dynamix_gym.envs.hetero_cluster:HeteroClusterEnv",
    "dynamix/HeteroClusterPerWorker-v0": "dynamix_gym.envs.per_worker:PerWorkerEnv",
    "dynamix/RealDDP-v0": "adapters.ddp_env:make_real_ddp_env",
    "dynamix/ElasticCluster-v0": "dynamix_gym.envs.elastic_cluster:ElasticClusterEnv",
    "dynamix/PipelineCluster-v1": "dynamix_gym.envs.pipeline_cluster:PipelineClusterEnv",
    "dynamix/RealPipeline-v1": "adapters.real_pipeline.env:make_real_pipeline_env",
    "dynamix/PipelineCluster-v0": "dynamix_gym.envs.pipeline_cluster:PipelineClusterEnv",
    "dynamix/RealPipeline-v0": "adapters.real_pipeline.env:make_real_pipeline_env",
}
#: registration kwargs of the older versions (their observation without the later features)
_ENV_KWARGS = {
    "dynamix/PipelineCluster-v0": {"move_gains": False},
    "dynamix/RealPipeline-v0": {"move_gains": False},
}
#: native vector envs (``gymnasium.make_vec(id, vectorization_mode="vector_entry_point")``)
_VECTOR_ENVS = {"dynamix/HeteroCluster-v0": "dynamix_gym.envs.batched_vector:BatchedClusterVectorEnv"}
for _id, _entry in _ENVS.items():
    if _id not in registry:
        # The env enforces its own time and decision budgets (truncation), so no TimeLimit here.
        register(
            id=_id,
            entry_point=_entry,
            vector_entry_point=_VECTOR_ENVS.get(_id),
            disable_env_checker=False,
            kwargs=_ENV_KWARGS.get(_id, {}),
        )
