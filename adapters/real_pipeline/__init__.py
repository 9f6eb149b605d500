"""Real pipeline-parallel training on CPU gloo ranks with ``torch.distributed.pipelining``.

:mod:`.ranks`: a live pool of stage ranks (a sequential model of named blocks on a shipped data
set); a re-partition stops at a step boundary, saves each block's state by name, re-splits and
restarts the ranks; every wait has a timeout, a hung or dead rank is named and no process is left.
:mod:`.twin`: the simulator's calibrated model of that job. :mod:`.backend`: the ranks behind the
simulator's interface. :mod:`.env`: ``dynamix/RealPipeline-v1``, the pipeline env over them.
"""
