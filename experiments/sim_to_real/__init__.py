"""What the fidelity app computes beside the sim-to-real runs (:mod:`adapters.sim2real`): the model checks
(:mod:`.checks`: iteration-time errors, the speed ladder, collapses) and the summary figures (:mod:`.summary`)."""
