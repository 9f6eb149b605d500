"""Host counters the adapter reports: network bytes, TCP retransmissions, CPU and memory.

Network bytes and retransmissions come from the kernel (``psutil.net_io_counters`` reads
/proc/net/dev; ``Tcp: RetransSegs`` from /proc/net/snmp). They are host-wide: with several ranks
on one host, each rank is given an equal share of its host's deltas.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

SNMP_PATH = "/proc/net/snmp"


def tcp_retrans_segs(path: str = SNMP_PATH) -> int:
    """The kernel's cumulative count of retransmitted TCP segments (0 where /proc is absent)."""
    try:
        with open(path) as fh:
            lines = [line.split() for line in fh if line.startswith("Tcp:")]
    except OSError:
        return 0
    if len(lines) < 2:
        return 0
    header, values = lines[0], lines[1]
    try:
        return int(values[header.index("RetransSegs")])
    except (ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class HostSnapshot:
    time_s: float
    bytes_sent: int
    retrans_segs: int

    @staticmethod
    def take() -> HostSnapshot:
        return HostSnapshot(time.perf_counter(), int(psutil.net_io_counters().bytes_sent), tcp_retrans_segs())

    def delta(self, later: HostSnapshot) -> tuple[float, float, float]:
        """(seconds, bytes sent, segments retransmitted) between this snapshot and ``later``."""
        return (
            later.time_s - self.time_s,
            float(max(later.bytes_sent - self.bytes_sent, 0)),
            float(max(later.retrans_segs - self.retrans_segs, 0)),
        )


class ProcessMeter:
    """CPU share (of one core) and host-memory share of this process between two reads."""

    def __init__(self, ranks_on_host: int = 1) -> None:
        self.proc = psutil.Process(os.getpid())
        self.ranks_on_host = max(int(ranks_on_host), 1)
        self.total_mem = psutil.virtual_memory().total
        self.mark()

    def mark(self) -> None:
        t = self.proc.cpu_times()
        self._cpu = t.user + t.system
        self._wall = time.perf_counter()

    def read(self, extra_busy_s: float = 0.0) -> tuple[float, float]:
        """(cpu_util, mem_util) since the last :meth:`mark`: CPU seconds / wall seconds (clipped to
        [0, 1]) and resident memory / this rank's share of host memory. ``extra_busy_s`` counts as
        CPU time: an emulated slower CPU device sleeps for its extra compute, which a slower device
        would have spent computing."""
        t = self.proc.cpu_times()
        cpu = t.user + t.system + extra_busy_s
        wall = max(time.perf_counter() - self._wall, 1e-9)
        cpu_util = min(max((cpu - self._cpu) / wall, 0.0), 1.0)
        mem_util = min(self.proc.memory_info().rss / (self.total_mem / self.ranks_on_host), 1.0)
        return cpu_util, mem_util
