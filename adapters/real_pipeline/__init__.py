"""Real pipeline-parallel training on CPU gloo ranks with ``torch.distributed.pipelining``
(:mod:`.ranks`): a sequential model of named blocks on a shipped data set, cut into two stages;
a re-partition stops at a step boundary, saves each block's state by name, re-splits and restarts
the stage ranks. Every wait has a timeout; a hung or dead rank is named and no process is left.
"""
