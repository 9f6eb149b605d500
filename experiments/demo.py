"""`make demo`: simulate the default heterogeneous scenario and print what happened.

    python -m experiments.demo
"""

from __future__ import annotations

import numpy as np

from sim.engine import Simulator


def main() -> None:
    sim = Simulator("t4v100", "cifar10", "mixed", seed=0)
    sim.reset()
    wl = sim.workload
    print(f"Cluster: {sim.cluster.name} ({', '.join(sim.gpu_types)}); workload: {wl.model}; scenario: mixed")
    b = np.clip(np.full(sim.num_workers, wl.initial_local_batch), sim.min_batch, sim.max_batch)
    header = f"{'t (min)':>8} {'val acc':>8} {'iter (s)':>9} {'comm (s)':>9} {'idle T4':>8} {'idle V100':>9}  events"
    print(header)
    t4 = np.array([g == "T4" for g in sim.gpu_types])
    step = 0
    while True:
        r = sim.run_interval(b, 50)
        step += 1
        done = r.val_accuracy >= wl.target_accuracy
        if step % 10 == 0 or done or r.events:
            idle = r.idle_time_s / np.maximum(r.iteration_time_s, 1e-9)
            print(
                f"{r.wall_time_s / 60:8.2f} {r.val_accuracy:8.4f} {r.iteration_time_s.mean():9.3f} "
                f"{r.comm_time_s:9.3f} {idle[t4].mean():8.1%} {idle[~t4].mean():9.1%}  {'; '.join(r.events)}"
            )
        if done or r.wall_time_s > wl.time_budget_s:
            break
    print(
        f"Static batch {b[0]} on every worker reached {r.val_accuracy:.3f} after {r.wall_time_s / 60:.1f} simulated "
        f"minutes ({step} intervals, {r.epoch:.1f} epochs)."
    )


if __name__ == "__main__":
    main()
