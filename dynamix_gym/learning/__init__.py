"""Learning a controller: PPO training on the simulator (:mod:`~dynamix_gym.learning.training`),
behaviour cloning and DAgger from an oracle (:mod:`~dynamix_gym.learning.imitation`) and the
centralised critic of the per-worker actor (:mod:`~dynamix_gym.learning.central_critic`)."""
