"""The elastic decision problem: rented pools, prices, spend, and the rewards and baselines of
``dynamix/ElasticCluster-v0`` (the env itself lives in :mod:`dynamix_gym.envs.elastic_cluster`)."""
