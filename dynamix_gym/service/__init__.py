"""The arbitrator service: one policy serving many training jobs over gRPC (DYNAMIX's deployment).

``arbitrator.proto`` defines the messages once; ``arbitrator_pb2*.py`` are generated from it
(``tests/dynamix_gym/service/test_arbitrator_proto.py`` regenerates them and compares). The server is
:mod:`dynamix_gym.service.server` (its gRPC transport: :mod:`dynamix_gym.service.transport`), the clients :mod:`dynamix_gym.service.client`, the online
learner :mod:`dynamix_gym.service.learner`; ``python -m experiments.serve`` runs the service.
"""
