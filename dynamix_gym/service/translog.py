"""The service's append-only transition log (JSON lines), and its reader.

One line per event, written whole and flushed to the operating system before the decision is
returned, so a killed service loses at most the line it was writing. The file is only ever opened
for appending; a restarted service appends to the same file. The reader skips a torn last line.

Records (``kind``):

    register  {job, session, task, workers, workload, bundle, version, next_seq, t}
    decision  {job, session, task, seq, version, t, obs (per-worker rows, rounded), action (indices),
               value, log_prob (per worker), reward (of the previous decision's interval),
               val_accuracy, wall_time_s, done, out_of_range (the inputs 6+ s.d. from the bundle's
               training mean at this decision)}
    end       {job, session, task, version, tta_s, reached, decisions, inputs_out_of_range
               ("name (k of n); ...", most often first), t}
    promote / reject / rollback   {version, parent, ..., t}  (the learner's lineage events)
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class TransitionLog:
    """Appends records to ``path`` (created with its folder); thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Append mode: O_APPEND writes never overwrite what an earlier run logged.
        self._file = open(self.path, "a", encoding="utf-8")
        self.records = 0

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.records += 1

    def sync(self) -> None:
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._file.close()


def read_log(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a log in order; a torn or corrupt line (a kill mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s: line %d is torn or corrupt; skipped", path, i + 1)
                continue
            if isinstance(rec, dict):
                yield rec


def last_seqs(path: str | Path) -> dict[str, int]:
    """job id -> the highest decision seq logged for it (a restarted service resumes past it)."""
    out: dict[str, int] = {}
    for rec in read_log(path):
        if rec.get("kind") == "decision":
            job, seq = str(rec.get("job")), int(rec.get("seq", -1))
            out[job] = max(out.get(job, -1), seq)
    return out
