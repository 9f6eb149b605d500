"""Point-to-point links between pipeline stages, read off the fitted all-reduce models.

``sim/data/comm_models.json`` (``python -m experiments.fit_hardware``) holds, per (GPU type,
application), the all-reduce time at two replicas within a node (``alpha_intra_s``) and across
nodes (``alpha_inter_s``). A ring all-reduce over R replicas sends 2 (R - 1) / R of the gradient
from every replica, which at R = 2 is the gradient once, so each positive fit gives a bandwidth

    bw(g, app, scope) = gradient_bytes(app) / alpha_scope_s(g, app)            # bytes / s

and a GPU type's link bandwidth is the median over the applications with a positive fit (some
fits put the whole time in the slope and leave alpha at 0). A link between two GPU types runs at
the slower one's bandwidth; a transfer of ``n`` bytes takes

    T_p2p = n / (bw * bandwidth_factor) + latency                              # blocking, not overlapped
"""

from __future__ import annotations

import statistics
from functools import cache

from sim.network import comm_table
from sim.workloads import WORKLOADS

#: Fixed latency of one point-to-point message, seconds (a TCP round trip inside a data centre).
P2P_LATENCY_S = 5e-5


@cache
def link_bandwidth_bytes_per_s(gpu: str, inter_node: bool) -> float:
    """The median two-replica all-reduce bandwidth of ``gpu``'s fits (see the module docstring)."""
    grad_bytes = {w.app: 4.0e6 * w.app_params_millions for w in WORKLOADS.values()}
    values = []
    for (g, app), p in comm_table().items():
        alpha = p.alpha_inter_s if inter_node else p.alpha_intra_s
        if g == gpu and alpha > 0 and app in grad_bytes:
            values.append(grad_bytes[app] / alpha)
    if not values:
        raise ValueError(f"no fitted all-reduce model of GPU type {gpu!r} gives a link bandwidth")
    return float(statistics.median(values))


def p2p_time_s(
    nbytes: float, gpu_a: str, gpu_b: str, inter_node: bool, bandwidth_factor: float = 1.0
) -> float:
    """Seconds to send ``nbytes`` from a ``gpu_a`` worker to a ``gpu_b`` worker (0 bytes: 0 s)."""
    if nbytes <= 0:
        return 0.0
    bw = min(link_bandwidth_bytes_per_s(gpu_a, inter_node), link_bandwidth_bytes_per_s(gpu_b, inter_node))
    return nbytes / (bw * bandwidth_factor) + P2P_LATENCY_S
