"""The simulator's pipeline mode: a model cut into stages on different workers.

- :mod:`.model`: blocks (compute per GPU type, parameter / optimiser / activation bytes), generated models
- :mod:`.links`: point-to-point bandwidth of a link, derived from the fitted all-reduce models
- :mod:`.schedule`: GPipe, 1F1B (synchronous, with flush) and asynchronous 1F1B: the iteration's makespan
- :mod:`.partition`: partitions (block boundaries), stage placement, the memory check
- :mod:`.staleness`: the convergence penalty of asynchronous 1F1B's stale weights
- :mod:`.simulator`: :class:`~sim.pipeline.simulator.PipelineSimulator`, interval by interval, under faults
- :mod:`.report`: :class:`~sim.pipeline.report.PipelineReport`, what one interval measured
"""
