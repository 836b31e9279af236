"""Where a benchmark writes its JSON: the file named, or a standard name inside a directory named.

Why: `--out runs/bench` (a directory) used to run the whole benchmark, minutes of it, and then die
with `IsADirectoryError` when it wrote. Every benchmark now resolves its output before it
measures anything: an existing directory gets `<name>.json` inside it, the file's directory is
created, and a file that could not be written there (read-only, no permission) fails at once with
the one-line error every command gives.
"""
from __future__ import annotations

import tempfile
from pathlib import Path


def result_path(out: Path, name: str) -> Path:
    """``out``, or ``out / name`` when ``out`` is an existing directory; its directory made and
    proven writable now (a temporary file is created in it and removed)."""
    path = out / name if out.is_dir() else out
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path.parent):
        pass
    return path


__all__ = ["result_path"]
