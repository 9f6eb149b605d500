"""A byte-level text corpus every machine has: the Python standard library's own source files.

The selection is deterministic: the public top-level modules (``*.py`` directly in
``sysconfig.get_paths()["stdlib"]``, names not starting with ``_``: the private ones include
generated, machine-specific files such as ``_sysconfigdata_*.py``), sorted by name, the first
``FILE_BYTES`` of each, concatenated until ``CORPUS_BYTES``. The same Python minor version gives
the same files; patch releases and distributions that patch the standard library may change a
few bytes, so the dataset's metadata records every file taken, its bytes and the corpus's SHA-256.

The vocabulary is the 256 byte values (``VOCAB``). A sample is one window of ``CONTEXT + 1``
consecutive bytes (windows start every ``CONTEXT`` bytes): the model reads the first ``CONTEXT``
and predicts each next byte.

    sample i = corpus[i * CONTEXT : i * CONTEXT + CONTEXT + 1]
    x = sample[:-1],  y = sample[1:]
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CORPUS_BYTES = 512 * 1024  # the corpus's fixed size
FILE_BYTES = 16 * 1024  # at most this much of each module (many modules rather than a few large ones)
CONTEXT = 64  # bytes the model reads per sample
VOCAB = 256  # byte values


@dataclass(frozen=True)
class Corpus:
    data: np.ndarray  # (CORPUS_BYTES,) uint8
    files: tuple[tuple[str, int], ...]  # (module file name, bytes taken), in corpus order
    root: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data.tobytes()).hexdigest()

    def meta(self) -> dict[str, Any]:
        """What the corpus is made of (recorded in the dataset's metadata)."""
        return {
            "source": "python standard library (public top-level modules, sorted by name)",
            "root": self.root,
            "python": platform.python_version(),
            "bytes": int(self.data.size),
            "file_bytes_cap": FILE_BYTES,
            "files": [list(f) for f in self.files],
            "sha256": self.sha256,
            "context": CONTEXT,
            "vocab": VOCAB,
        }


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_corpus(
    root: str | Path | None = None, budget_bytes: int = CORPUS_BYTES, file_bytes: int = FILE_BYTES
) -> Corpus:
    """The corpus (module docstring) from ``root`` (default: this interpreter's standard library).

    Raises:
        FileNotFoundError: ``root`` is not a directory.
        ValueError: the public modules there hold fewer than ``budget_bytes`` bytes under the
            per-file cap (a stripped installation).
    """
    if budget_bytes < CONTEXT + 1 or file_bytes < 1:
        raise ValueError(
            f"budget_bytes must be >= {CONTEXT + 1} and file_bytes >= 1, got {budget_bytes}, {file_bytes}"
        )
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise FileNotFoundError(f"the Python standard library directory {base} does not exist")
    modules = sorted(p for p in base.glob("*.py") if not p.name.startswith("_") and p.is_file())
    parts: list[bytes] = []
    files: list[tuple[str, int]] = []
    filled = 0
    for path in modules:
        if filled >= budget_bytes:
            break
        chunk = path.read_bytes()[: min(file_bytes, budget_bytes - filled)]
        if chunk:
            parts.append(chunk)
            files.append((path.name, len(chunk)))
            filled += len(chunk)
    if filled < budget_bytes:
        raise ValueError(
            f"the standard library at {base} holds {filled} bytes of public modules (at most {file_bytes} "
            f"per file, {len(modules)} modules); the corpus needs {budget_bytes}"
        )
    data = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    return Corpus(data=data, files=tuple(files), root=str(base))


def windows(data: np.ndarray, context: int = CONTEXT) -> np.ndarray:
    """``(n, context + 1)`` int64 windows starting every ``context`` bytes (module docstring)."""
    n = (int(data.size) - 1) // context
    if n < 1:
        raise ValueError(f"a corpus of {data.size} bytes holds no window of {context + 1} bytes")
    starts = np.arange(n) * context
    return data[starts[:, None] + np.arange(context + 1)[None, :]].astype(np.int64)
