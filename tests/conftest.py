"""Fixtures and hooks every test directory shares (plain helpers: tests/support.py).

* tests marked ``gpu`` are skipped when no CUDA device is present (``make test`` deselects them);
* ``headline_bundle``: the shipped PPO bundle of results/headline, loaded once per session.
"""

from __future__ import annotations

import pytest
import torch
from support import HEADLINE_BUNDLE

import experiments.train_schema  # noqa: F401  (conf/train.yaml's schema, for in-process compose)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def headline_bundle():
    """The headline PPO bundle (dynamix_gym.controllers.bundle.load_bundle), one torch thread."""
    from dynamix_gym.controllers.bundle import load_bundle

    torch.set_num_threads(1)
    return load_bundle(HEADLINE_BUNDLE)
