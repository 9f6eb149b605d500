"""Fixtures: the headline bundle, and an arbitrator serving it on a free localhost port."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from support import HEADLINE_BUNDLE as BUNDLE

from dynamix_gym.controllers.bundle import load_bundle
from dynamix_gym.service.server import ArbitratorService, PolicyStore, ServiceConfig
from dynamix_gym.service.transport import build_server

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture(scope="session")
def bundle():
    torch.set_num_threads(1)
    return load_bundle(BUNDLE)


class Running:
    """A service on 127.0.0.1 (in-process, real gRPC), stoppable and restartable on its port."""

    def __init__(self, bundle, log_path: Path, config: ServiceConfig | None = None, learner=None) -> None:
        self.bundle, self.log_path, self.config, self.learner = bundle, log_path, config, learner
        self.port = 0
        self.start()

    def start(self) -> None:
        self.service = ArbitratorService(
            PolicyStore({"default": self.bundle}), self.log_path, self.config, np.random.default_rng(0)
        )
        self.service.learner = self.learner
        self.server, self.port = build_server(self.service, TOKEN, port=self.port, threads=8)
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5.0)
        self.service.close()


@pytest.fixture
def running(bundle, tmp_path):
    r = Running(bundle, tmp_path / "transitions.jsonl")
    yield r
    r.stop()


def run_in_threads(fns) -> list:
    """Run callables concurrently; re-raise the first failure."""
    out, errors = [None] * len(fns), []

    def call(i, fn):
        try:
            out[i] = fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out
