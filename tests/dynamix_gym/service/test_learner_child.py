"""The learner's child-process worker: the same update as on the learner's thread, and no child
left behind whatever happens to the call or its caller."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from dynamix_gym.benchmark.validation import make_validator
from dynamix_gym.service.child import ChildCancelled, ChildError, call_in_child
from dynamix_gym.service.learner import LearnerConfig, OnlineLearner
from dynamix_gym.service.server import PolicyStore


def _transitions(bundle, seed: int = 5) -> list[tuple]:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(2, 40, bundle.model.observation_space.shape[0])).astype(np.float32)
    return [
        (f"job{j}/s{j}", 0, obs[j, k], int(rng.integers(5)), 0.1, -1.6, float(rng.normal()), k == 39, 0.0, 0)
        for j in range(2)
        for k in range(40)
    ]


def _weights(served) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(served.bundle.model.policy.parameters()).detach()


def _children(pid: int | None = None) -> list[psutil.Process]:
    """Live children of ``pid`` (this process), not counting multiprocessing's resource tracker."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if (
                p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())
            ):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.timeout(240)
def test_an_update_in_a_child_process_is_the_update_on_the_learners_thread(bundle, tmp_path):
    validate = make_validator({"tasks": ["ncf_t4v100_jitter", "ncf_a100t4_congestion"], "seeds": [100]})
    out = {}
    for worker in ("thread", "process"):
        store = PolicyStore({"default": bundle})
        learner = OnlineLearner(
            store,
            "default",
            tmp_path / worker,
            validate=validate,
            config=LearnerConfig(
                update_every=16, n_epochs=2, batch_size=32, learning_rate=1e-4, worker=worker
            ),
            rng=np.random.default_rng(0),
        )
        learner.add_transitions(_transitions(bundle))
        gated = learner.step(force=True)  # validated: the parent's and the candidate's scores
        forced = learner.step(force=True, skip_validation=True)  # promoted: its weights are served
        out[worker] = (gated, forced, _weights(store.get()), learner.rng.bit_generator.state)
        assert not _children()
    (g_thread, f_thread, w_thread, rng_thread), (g_proc, f_proc, w_proc, rng_proc) = out.values()
    assert g_proc["validation_by_task"] == g_thread["validation_by_task"]
    assert g_proc["parent_validation_tta_s"] == g_thread["parent_validation_tta_s"]
    assert g_proc["update"] == g_thread["update"] and g_proc["status"] == g_thread["status"]
    assert f_proc["status"] == f_thread["status"] == "promoted"
    assert torch.equal(w_proc, w_thread)
    assert not torch.equal(w_proc, torch.nn.utils.parameters_to_vector(bundle.model.policy.parameters()))
    assert rng_proc == rng_thread  # the child's draws advanced the learner's generator alike
    assert 0 < g_proc["t"] - g_proc["t_start"] < 600  # the update's span, for bench_serve's split


def test_a_process_worker_needs_a_validator_that_pickles(bundle, tmp_path):
    with pytest.raises(ValueError, match=r"learner\.worker=process .* must pickle"):
        OnlineLearner(
            PolicyStore({"default": bundle}),
            "default",
            tmp_path,
            validate=lambda b: {"t": 1.0},
            config=LearnerConfig(worker="process"),
        )
    with pytest.raises(ValueError, match=r"learner\.worker must be one of"):
        LearnerConfig(worker="fork")
    with pytest.raises(ValueError, match=r"learner\.worker_timeout_s must be a positive"):
        LearnerConfig(worker_timeout_s=0)


def test_a_failing_dying_slow_or_cancelled_child_is_an_error_and_leaves_no_process():
    # at normal priority: an idle child waits for the other test worker to leave a core (35 s under
    # make test's two workers); the priority itself is test_a_child_runs_idle_niced_on_one_thread's
    normal = {"idle": False, "nice": 0}
    assert call_in_child(math.sqrt, 16.0, **normal) == 4.0
    with pytest.raises(ChildError, match=r"ValueError: math domain error"):
        call_in_child(math.sqrt, -1.0, **normal)
    with pytest.raises(ChildError, match=r"exited with code 7 before answering"):
        call_in_child(os._exit, 7, **normal)
    with pytest.raises(TimeoutError, match=r"no answer within 1.0 s"):
        call_in_child(time.sleep, 60.0, timeout_s=1.0, **normal)
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(ChildCancelled):
        call_in_child(time.sleep, 60.0, cancel=cancel, **normal)
    assert time.monotonic() - t0 < 30.0
    assert not _children()


def test_a_child_exits_when_its_caller_is_killed(tmp_path):
    """A SIGKILL-ed service cannot terminate its child: the child sees it re-parented and exits.
    The child runs at normal priority here: the learner's SCHED_IDLE child gets no CPU at all while
    the machine is busy (it failed so at load 10-14, passing alone), and would notice only later."""
    script = textwrap.dedent(
        """
        import sys, time
        from dynamix_gym.service.child import call_in_child
        call_in_child(time.sleep, 120.0, idle=False, nice=0)
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 60.0
        kids: list[psutil.Process] = []
        while time.monotonic() < deadline and not kids:
            kids = _children(caller.pid)
            time.sleep(0.2)
        assert kids, "the caller never started its child"
        caller.kill()
        caller.wait(10.0)
        _gone, alive = psutil.wait_procs(kids, timeout=15.0)
        assert not alive, f"orphaned children: {[p.pid for p in alive]}"
    finally:
        if caller.poll() is None:
            caller.kill()


def _child_priority(_: object) -> tuple[int, int, int]:
    import torch

    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), torch.get_num_threads()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.slow  # an idle-priority child imports torch only when the other test worker leaves a core: ~30 s
def test_a_child_runs_idle_niced_on_one_thread():
    """The learner's child only takes CPU time the service leaves (bench_serve learn=true)."""
    policy, nice, threads = call_in_child(_child_priority, None)
    assert policy == os.SCHED_IDLE
    assert nice >= os.getpriority(os.PRIO_PROCESS, 0) + 10 or nice == 19
    assert threads == 1
    policy, _nice, threads = call_in_child(_child_priority, None, idle=False, nice=0, threads=2)
    assert policy == os.SCHED_OTHER and threads == 2
