"""The Gymnasium environments (one class per file; ids registered by :mod:`dynamix_gym`):

- :mod:`.hetero_cluster`: ``dynamix/HeteroCluster-v0``, the centralised env over any backend
- :mod:`.per_worker`: ``dynamix/HeteroClusterPerWorker-v0``, one worker's decision per step
- :mod:`.parallel_cluster`: the per-worker problem as a PettingZoo ``ParallelEnv``
- :mod:`.pipeline_cluster`: ``dynamix/PipelineCluster-v1``, partitions of a pipeline-parallel model
- :mod:`.elastic_cluster`: ``dynamix/ElasticCluster-v0``, GPUs rented from a priced pool
- :mod:`.randomized`: domain-randomised worlds for pretraining; :mod:`.vec_env`: vectorised envs
- :mod:`.batched_vector` (``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``) and
  :mod:`.batched_per_worker` (SB3): many simulated clusters stepped as one batch
  (:mod:`.batched_core` over :mod:`sim.batched`)
"""
