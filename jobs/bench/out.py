"""What a benchmark writes: one figure's record, and where its JSON goes (the file named, or a
standard name inside a directory named).

Why the figure lives here: `bench all` collects the figures of every section, and a section
(`bench verl`) that took the shape from `bench all` made the two modules import each other.

Why the path is resolved first: `--out runs/bench` (a directory) used to run the whole benchmark,
minutes of it, and then die with `IsADirectoryError` when it wrote. Every benchmark now resolves
its output before it measures anything: an existing directory gets `<name>.json` inside it, the
file's directory is created, and a file that could not be written there (read-only, no permission)
fails at once with the one-line error every command gives.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def result_path(out: Path, name: str) -> Path:
    """``out / name`` when ``out`` names a directory (an existing one, or a path not there yet
    whose name has no suffix: ``--out runs/bench``), else ``out`` itself (``--out r.json``); its
    directory made and proven writable now (a temporary file is created in it and removed)."""
    path = out / name if out.is_dir() or (not out.exists() and not out.suffix) else out
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path.parent):
        pass
    return path


def figure(path: str, value: float, unit: str, reference: str, ref_value: float,
           ratio: float, ratio_label: str, goal: str, meets: bool | None,
           in_summary: bool = False, bound: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row of the results: our figure beside the reference measured in the same run, their
    ratio, and the goal it is held to (``meets`` None where there is none). ``in_summary``: a
    figure without a goal that the README's summary still shows, because a figure with a goal
    is only the whole story beside it (what the background mirror costs per step). ``bound``:
    the most the ratio could reach in this run, where something outside our code sets it (see
    `bound`)."""
    out = {"path": path, "value": value, "unit": unit, "reference": reference,
           "reference_value": ref_value, "ratio": ratio, "ratio_label": ratio_label,
           "goal": goal, "meets_goal": meets, "in_summary": in_summary}
    if bound is not None:
        out["bound"] = bound
    return out


def bound(ratio: float, by: str, reachable: bool) -> dict[str, Any]:
    """The most a figure's ratio could reach in its run (``ratio``), what sets it (``by``: calls
    of a system every implementation makes, timed bare in the same rounds) and whether the goal
    lies within it: a goal beyond it is out of reach for any code of ours in that run."""
    return {"ratio": ratio, "by": by, "reachable": reachable}


__all__ = ["bound", "figure", "result_path"]
