"""One function call in a spawned child process: the online learner's heavy work off the service's GIL.

An update (PPO epochs or DAgger episodes in the simulator, then the validation runs) is a minute of
pure-Python and torch work. On the service's own learner thread it holds the interpreter lock in
long stretches, and every decision waits behind it (``experiments.bench_serve`` with
``learn=true``: p99 72.6 ms against 17.8 ms without learning). :func:`call_in_child` runs the
call in a fresh ``spawn``-ed process instead, one at a time, under ``SCHED_IDLE`` at a lower
priority and on one thread, so that the service's threads keep the interpreter and the first core.

The child never outlives its caller: it is a daemonic process (multiprocessing terminates it when
the service exits), it watches its parent's pid and exits if the parent dies (a ``SIGKILL``-ed
service), and the caller terminates it when the call is cancelled, times out or fails. A failure in
the child comes back as :class:`ChildError` with the child's traceback; the caller's state is
untouched, since the child only ever returns a value.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


class ChildError(RuntimeError):
    """The call failed in the child, or the child died before it answered."""


class ChildCancelled(RuntimeError):
    """The call was cancelled (the service is stopping); the child was terminated."""


def _watch_parent(ppid: int, poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        if os.getppid() != ppid:  # re-parented: the caller died without terminating us
            os._exit(3)


def _lower_priority(pid: int, niceness: int | None, idle: bool) -> None:
    """``pid``'s scheduling (0: this thread; Linux applies both per thread and new threads inherit
    them, so the child calls it before starting any)."""
    if idle and hasattr(os, "SCHED_IDLE"):
        try:  # runs only on CPU time no normal-priority thread wants
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass
    if niceness is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, niceness)
        except OSError:  # not permitted here: run at the caller's priority
            pass


def _child_main(conn, task, ppid: int, niceness: int | None, idle: bool, threads: int) -> None:
    _lower_priority(0, niceness, idle)
    threading.Thread(target=_watch_parent, args=(ppid, 0.5), name="parent-watch", daemon=True).start()
    limits = None
    if threads:
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(int(threads))
        limits = threadpool_limits(int(threads))  # numpy's BLAS / OpenMP pools too
    try:
        fn, payload = task.recv()  # unpickled here, at the lowered priority: it imports their modules
        task.close()
        result: tuple[str, Any] = ("ok", fn(payload))
    except BaseException as exc:  # everything goes back to the caller, as text
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    try:
        conn.send(result)
    finally:
        conn.close()
        if limits is not None:
            limits.unregister()


def _stop(proc) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(5.0)
        if proc.is_alive():
            proc.kill()
    proc.join()


def call_in_child(
    fn: Callable[[Any], Any],
    payload: Any,
    *,
    cancel: threading.Event | None = None,
    timeout_s: float | None = None,
    nice: int = 10,
    idle: bool = True,
    threads: int = 1,
    poll_s: float = 0.1,
    name: str = "dynamix-child",
) -> Any:
    """``fn(payload)`` in a spawned child; its return value (both must pickle: ``fn`` a module-level
    function). Waits without holding the interpreter lock.

    The child runs at ``nice`` and, with ``idle`` (Linux), under ``SCHED_IDLE``, so it only takes
    CPU time the caller's threads leave; ``threads`` caps torch's and the BLAS / OpenMP pools.

    Raises:
        ChildError: ``fn`` raised (its traceback in the message), or the child died first.
        ChildCancelled: ``cancel`` was set while waiting.
        TimeoutError: no answer within ``timeout_s``.
    """
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    niceness = min(os.getpriority(os.PRIO_PROCESS, 0) + int(nice), 19) if nice else None
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    task_recv, task_send = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child_main,
        args=(send, task_recv, os.getpid(), niceness, idle, threads),
        name=name,
        daemon=True,
    )
    proc.start()  # the arguments are small: it returns while the child still starts up
    # from here, at once, since the child's own call comes only after its start-up has imported the
    # service's main module (seconds of CPU at the caller's priority otherwise)
    _lower_priority(proc.pid, niceness, idle)
    send.close()  # the child holds the only writer: its death reads as EOF here
    task_recv.close()
    t0 = time.monotonic()
    try:
        try:  # read by the child once its priority is lowered (a pickling error raises here)
            task_send.send((fn, payload))
        except OSError:
            pass  # the child died before reading it: its exit code is reported below
        finally:
            task_send.close()
        while True:
            if recv.poll(poll_s):
                try:
                    status, value = recv.recv()
                except EOFError:
                    proc.join(5.0)
                    raise ChildError(f"{name} exited with code {proc.exitcode} before answering") from None
                break
            if cancel is not None and cancel.is_set():
                raise ChildCancelled(f"{name} cancelled")
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"{name} gave no answer within {timeout_s} s")
    finally:
        _stop(proc)
        recv.close()
    if status != "ok":
        raise ChildError(f"{name} failed: {value}")
    return value
