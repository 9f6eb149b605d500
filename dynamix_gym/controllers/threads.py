"""One BLAS thread for the controllers' tiny linear algebra.

Their matrices are a few dozen rows: on a loaded machine several BLAS threads fighting for cores
make a 20 x 20 triangular solve ~50x slower than one thread does, and a controller's decision
time is its overhead on a real cluster.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from threadpoolctl import ThreadpoolController

_controller: ThreadpoolController | None = None


def single_blas_thread() -> AbstractContextManager:
    """Context manager limiting BLAS to one thread (the libraries are looked up once)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
