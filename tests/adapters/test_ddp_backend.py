"""Real multi-process DDP runs on CPU with gloo (2-3 ranks): the backend protocol end to end."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import psutil
import pytest
import torch
import torch.nn.functional as F
from support import ROOT, run_python

from adapters.config import RealDDPConfig
from adapters.data import load_dataset
from adapters.ddp_backend import DDPBackend, WorkerFailure, _main_not_reimported
from adapters.ddp_env import make_real_ddp_env
from adapters.faults import FaultEmulator
from adapters.models import build_model
from adapters.sampling import GlobalBatchSchedule, rank_slice
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.obs import OBS_SCHEMA
from sim.faults import FaultWindow, Scenario
from sim.scaling import lr_gain

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WORKER_FEATURES = [f.name for f in OBS_SCHEMA.worker_features]


@pytest.fixture(scope="module")
def shared_backend():
    """One 2-rank backend shared by this module's tests (starting ranks is the slow part)."""
    b = DDPBackend(
        workers=2,
        min_batch=4,
        max_batch=128,
        initial_batch=16,
        memory_batch=(128, 48),  # rank 1 "runs out of memory" above 48
        record_indices=True,
        timeout_s=6,
        target_accuracy=1.0,
        guards="off",  # these tests check the lr rules' arithmetic; the guards' own: test_guards_real.py
    )
    yield b
    b.close()


@pytest.fixture
def backend(shared_backend):
    """The shared backend as the module built it, whatever ran before (so that no test depends on
    the order): the settings tests change are put back after each one, and every test starts with
    a ``reset``, which starts new workers where a test killed the last ones."""
    b = shared_backend
    config, faults = b.config, b.faults
    yield b
    b.config, b.faults = config, faults
    b.extra_state.clear()
    if not all(alive(pid) for pid in b.worker_pids):
        b.close()  # workers killed behind its back: stop the rest, so that the next reset starts new ones


class Borrowed:
    """The shared backend behind an env whose close() must not stop it."""

    def __init__(self, inner: DDPBackend) -> None:
        self.inner = inner
        self.spec = inner.spec

    def reset(self, seed=None, *, rng=None):
        self.inner.reset(seed, rng=rng)

    def run_interval(self, local_batches, iterations):
        return self.inner.run_interval(local_batches, iterations)

    def close(self):
        pass


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: list[int]) -> bool:
    """No process left (joined children no longer exist; a zombie would mean nobody reaped it)."""
    for pid in pids:
        try:
            psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        return False
    return True


def test_uneven_batches_give_the_global_batch_mean_gradient():
    batches = [5, 17, 40]
    b = DDPBackend(workers=3, dataset="synthetic", model="cnn")
    try:
        b.reset(seed=0)
        out = b.gradient(batches)
    finally:
        b.close()
    ref = out[0]
    # Every replica holds the same averaged gradient ...
    for r in out[1:]:
        np.testing.assert_array_equal(r["indices"], ref["indices"])
        np.testing.assert_allclose(r["gradient"], ref["gradient"], rtol=0, atol=1e-7)
    # ... equal to one process's gradient of the mean loss over the concatenated global batch.
    data = load_dataset("synthetic")
    model = build_model("cnn", data.input_shape, data.num_classes)
    model.load_state_dict(ref["state"])
    idx = torch.from_numpy(ref["indices"])
    assert len(idx) == sum(batches)
    F.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
    single = torch.cat([p.grad.flatten() for p in model.parameters()]).numpy()
    np.testing.assert_allclose(ref["gradient"], single, rtol=1e-4, atol=1e-6)
    # Averaging the ranks' local mean gradients instead (plain DDP) would not match.
    local_means = []
    for r in range(3):
        model.zero_grad()
        sl = idx[rank_slice(batches, r)]
        F.cross_entropy(model(data.x_train[sl]), data.y_train[sl]).backward()
        local_means.append(torch.cat([p.grad.flatten() for p in model.parameters()]).numpy())
    assert not np.allclose(np.mean(local_means, axis=0), single, rtol=1e-2, atol=1e-4)


def test_batch_changes_mid_run_and_out_of_memory_step_back(backend):
    backend.config = replace(backend.config, lr_rule="linear")  # a coordinator-side setting
    env = HeteroClusterEnv(backend=Borrowed(backend), interval=4, action_mode="absolute")
    try:
        env.reset(seed=3)
        schedule = GlobalBatchSchedule(backend.train_size, backend.run_seed)
        for _ in range(4):  # replay the warm-up interval at (16, 16)
            schedule.next_global(32)
        plan = [[16, 16], [40, 8], [40, 8], [9, 33], [64, 64], [64, 40]]
        for k, target in enumerate(plan):
            obs, _reward, _term, _trunc, info = env.step(np.array(target, dtype=np.float32))
            report = info["report"]
            replies = backend.last_replies
            applied = [64, 33] if target == [64, 64] else target  # rank 1 steps back to its last good 33
            assert report.local_batch.tolist() == applied, k
            assert report.global_batch == sum(applied)
            assert report.samples == 4 * sum(applied)
            assert replies[0]["lr"] == pytest.approx(0.05 * sum(applied) / 32)  # linear rule, applied batch
            if target == [64, 64]:
                assert any("out of memory on worker 1" in e for e in report.events)
            # The ranks took disjoint slices that together are exactly the shared global batches.
            for it in range(4):
                idx = schedule.next_global(sum(applied))
                for r in range(2):
                    np.testing.assert_array_equal(replies[r]["indices"][it], idx[rank_slice(applied, r)])
            assert obs.shape == env.observation_space.shape
        assert report.val_accuracy > 0.5
        params = backend.parameters()
        np.testing.assert_array_equal(params[0], params[1])  # the replicas never diverged
    finally:
        backend.config = replace(backend.config, lr_rule="adascale")


def test_adascale_learning_rate_follows_the_noise_scale_estimate(backend):
    backend.reset(seed=0)
    backend.run_interval(np.array([16, 48]), 5)
    assert backend.last_replies[0]["lr"] == pytest.approx(0.05)  # no estimate yet: base lr
    noise = backend.noise.noise_scale
    assert noise is not None and noise > 0
    backend.run_interval(np.array([64, 40]), 5)
    assert backend.last_replies[0]["lr"] == pytest.approx(0.05 * lr_gain("adascale", 104, 32, noise))


def test_injected_slowdown_is_visible_in_reports_and_observations(backend):
    scenario = Scenario(name="one_slow", worker_speed=(1.0, 0.25))  # worker 1 is 4x slower
    saved = backend.faults
    backend.faults = FaultEmulator(scenario, 2, backend.spec.gpu_types)
    env = HeteroClusterEnv(backend=Borrowed(backend), interval=20)
    try:
        obs, info = env.reset(seed=0)
        obs, *_, info = env.step(np.array([2, 2]))
    finally:
        backend.faults = saved
    r = info["report"]
    # Rank 1 computes 4x as long as its own measured compute (it sleeps 3x the time to its last
    # gradient bucket; the optimiser step is not slowed), whatever the machine's load does to the
    # two ranks' native speeds: compared with its own native time, not with rank 0's.
    replies = backend.last_replies
    assert np.sum(replies[0]["injected_s"]) == 0.0
    compute_1, injected_1 = np.mean(replies[1]["compute_s"]), np.mean(replies[1]["injected_s"])
    assert r.compute_time_s[1] == pytest.approx(compute_1, rel=1e-9)  # the report's per-iteration mean
    assert 3.0 < compute_1 / (compute_1 - injected_1) <= 4.0 + 1e-9, (compute_1, injected_1)
    assert r.compute_time_s[1] > r.compute_time_s[0]
    assert r.idle_time_s[0] > 0.5 * (r.compute_time_s[1] - r.compute_time_s[0])
    assert r.idle_time_s[1] < r.idle_time_s[0]
    w = obs[: 2 * len(WORKER_FEATURES)].reshape(2, -1)
    share, idle = WORKER_FEATURES.index("compute_share"), WORKER_FEATURES.index("idle_fraction")
    assert w[0, share] < w[1, share]  # the fast worker's compute is a small share of the slowest's
    assert w[0, idle] > w[1, idle]  # and it idles at the barrier


def test_a_throttle_that_starts_inside_an_interval_slows_the_iterations_after_it(backend):
    """As in the simulator, a compute fault takes effect at its time, not at the next interval."""
    scenario = Scenario(
        name="late_throttle",
        windows=(FaultWindow("throttle", start_s=0.15, duration_s=100.0, worker=1, factor=0.25),),
    )
    saved = backend.faults
    backend.faults = FaultEmulator(scenario, 2, backend.spec.gpu_types)
    try:
        backend.reset(seed=0)
        r = backend.run_interval(np.array([64, 64]), 60)
    finally:
        backend.faults = saved
    start = r.wall_time_s - r.interval_time_s
    assert start < 0.15 < r.wall_time_s, (start, r.wall_time_s)  # the interval ran across its start
    injected = [float(x) for x in backend.last_replies[1]["injected_s"]]
    assert injected[0] == 0.0  # before the throttle: native speed
    assert injected[-1] > 0.0  # after it: rank 1 sleeps 3x its compute
    assert not any(backend.last_replies[0]["injected_s"])  # rank 0 is never slowed


def test_killed_worker_raises_a_clear_error_and_leaves_no_orphans(backend):
    backend.reset(seed=0)
    pids = backend.worker_pids
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(pids[1], signal.SIGKILL)
        killed_at.append(time.monotonic())

    threading.Timer(1.0, kill).start()
    with pytest.raises(WorkerFailure, match=r"rank 1 .*killed by SIGKILL") as err:
        for _ in range(200):  # ~0.1 s per interval: the kill lands mid-interval
            backend.run_interval(np.array([32, 32]), 20)
    assert err.value.rank == 1
    # Named within seconds of the kill itself (however late a loaded machine ran the timer).
    assert killed_at and time.monotonic() - killed_at[0] < 5.0
    assert gone(pids)
    backend.close()  # safe after a failure


@pytest.mark.slow  # real DDP ranks: make test-slow
def test_hung_worker_is_named_within_the_collective_timeout(backend):
    backend.reset(seed=0)  # new workers after the previous test's failure
    pids = backend.worker_pids
    backend.run_interval(np.array([32, 32]), 5)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(WorkerFailure, match=r"rank 1 .*stopped responding") as err:
            backend.run_interval(np.array([32, 32]), 5)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    elapsed = time.monotonic() - t0
    assert err.value.rank == 1
    # Named within the collective timeout: the wait the message reports (the time to reap the
    # processes afterwards, which a loaded machine stretches, has the looser bound below).
    waited = float(re.search(r"waited ([0-9.]+) s", str(err.value)).group(1))
    assert waited <= backend.config.timeout_s + 1.0, str(err.value)
    assert elapsed <= backend.config.timeout_s + 10.0, elapsed
    assert gone(pids)


@pytest.mark.slow  # real DDP ranks: make test-slow
def test_resume_from_checkpoint_continues_the_same_run(backend, tmp_path):
    a = backend
    a.config = replace(a.config, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    a.extra_state["controller"] = lambda: {"calls": 7}
    batches = [np.array([16, 24]), np.array([16, 24]), np.array([40, 8])]
    try:
        a.reset(seed=5)
        for b in batches:
            a.run_interval(b, 6)
        expected = a.parameters()[0]
        wall_at_crash = a.wall_time_s()
        for pid in a.worker_pids:  # crash: every worker dies after interval 3 (checkpoint at 2)
            os.kill(pid, signal.SIGKILL)
    finally:
        a.config = replace(a.config, checkpoint_dir=None, checkpoint_every=0)
        a.extra_state.clear()

    b_ = DDPBackend(replace(a.config, checkpoint_dir=str(tmp_path), resume=True))
    assert b_.spec.initial_batch.tolist() == [16, 24]  # the checkpoint's batches
    try:
        b_.reset(seed=123)  # ignored: the run's own seed comes from the checkpoint
        assert b_.resumed_interval == 2
        assert b_.restored_extra == {"controller": {"calls": 7}}
        report = b_.run_interval(batches[2], 6)  # redo interval 3
        np.testing.assert_allclose(b_.parameters()[0], expected, rtol=0, atol=1e-6)
        assert report.wall_time_s < wall_at_crash + report.interval_time_s + 5.0
        assert report.epoch == pytest.approx((2 * 6 * 40 + 6 * 48) / b_.train_size)
    finally:
        b_.close()


NO_GUARD = """
import gymnasium as gym
import dynamix_gym  # noqa: F401
env = gym.make("dynamix/RealDDP-v0", workers=2)
env.reset(seed=0)
"""


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """Spawned workers re-import the main module: a script that builds the env at top level would
    have them die while starting (``exit code 1``); the error says what to do instead."""
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD)
    proc = run_python([script], timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr and str(script) in proc.stderr, proc.stderr[-2000:]
    assert "died" not in proc.stderr  # refused before any worker started


def test_building_the_env_in_a_worker_that_imports_the_main_module_names_the_guard(monkeypatch):
    """Where the guard is there but the env is built above it, each spawned worker re-runs that
    code while importing the main module: there (its stderr is the user's) it says so too."""
    monkeypatch.setattr(mp.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=r'if __name__ == "__main__":'):
        make_real_ddp_env(workers=2)


GUARD_BELOW = """
print("top level ran", flush=True)
import gymnasium as gym
import dynamix_gym  # noqa: F401
env = gym.make("dynamix/RealDDP-v0", workers=2)
env.reset(seed=0)
env.close()
if __name__ == "__main__":
    pass
"""


def test_ranks_start_without_re_running_the_main_module(tmp_path):
    """The ranks are spawned without re-importing the parent's main module: an env built above the
    guard (which would have them re-run it and die while starting) works, and the script's top
    level runs once, in the parent only."""
    script = tmp_path / "guard_below.py"
    script.write_text(GUARD_BELOW)
    proc = run_python([script], timeout=180, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("top level ran") == 1, proc.stdout


def test_the_main_module_is_hidden_from_spawning_unless_the_config_holds_one_of_its_objects():
    main = sys.modules["__main__"]
    before = (main.__dict__.get("__spec__"), main.__dict__.get("__file__"))
    with _main_not_reimported(RealDDPConfig(workers=1)):
        assert main.__spec__ is None and "__file__" not in vars(main)
    assert (main.__dict__.get("__spec__"), main.__dict__.get("__file__")) == before
    local = type("Local", (), {"__module__": "__main__"})()
    with _main_not_reimported(RealDDPConfig(workers=1, scenario=local)):
        assert (main.__dict__.get("__spec__"), main.__dict__.get("__file__")) == before
