"""The agent's side of the pipeline problem (``dynamix/PipelineCluster-v1``):

- :mod:`.planner`: the quiet cluster's stage profile, PipeDream's DP, DynPipe's T(S) x W(S)
- :mod:`.controllers`: the even split, PipeDream's planner, DynPipe, the truth-reading re-planner
- :mod:`.forest`: DynPipe's slowdown predictor (a scikit-learn random forest) and its features
- :mod:`.evaluation`: one controller for one episode; the hindsight limit
- :mod:`.worlds`: generated pipelines and the ``pipeline`` split (train / test)
"""
