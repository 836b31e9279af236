"""Rows, groups, lake read-backs and child processes for the tests; all on the real buffer and
the real lake on disk, nothing mocked.

- ``traj(uid, session, ...)``: one trajectory row as a plain dict (override any column by keyword).
- ``add_group(buf, uid, gs, rewards)``: register + fill + finish (or fail) a group in one call.
- ``lake_history(lake)`` / ``lake_counts(lake)``: every lake table's rows / row counts, from disk.
- ``write_script`` / ``python_env`` / ``run_python``: real subprocesses with the venv's interpreter.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pipeline import ReplayBuffer
from pipeline.lake.writer import read_table
from schemas import LAKE_TABLES

ROOT = Path(__file__).resolve().parents[2]


def traj(uid: str, session: int, *, partition: str = "train", min_gs: int = 0, max_gs: int = 0,
         reward: float = 0.0, prompt: Sequence[int] = (1, 2), response: Sequence[int] = (3, 4),
         **kw: Any) -> dict[str, Any]:
    """One trajectory row (index 0 unless ``index=`` is given); ``kw`` adds or overrides columns."""
    row: dict[str, Any] = {
        "partition": partition, "uid": uid, "session_id": session,
        "min_global_steps": min_gs, "max_global_steps": max_gs, "reward": reward,
        "prompt_ids": list(prompt), "response_ids": list(response),
    }
    row.update(kw)
    return row


def add_group(buf: ReplayBuffer, uid: str, gs: int = 0, rewards: Iterable[float] = (0.0, 1.0), *,
              status: str = "finished", partition: str = "train", n: int | None = None,
              min_gs: int | None = None, max_gs: int | None = None) -> list[dict[str, Any]]:
    """Register ``uid`` dispatched at ``gs``, put one trajectory per reward, then move it to
    ``status`` (pending | running | finished | failure). Versions default to ``gs - 1`` (the
    weights a prompt dispatched at ``gs`` is generated with). Returns the rows it put."""
    v = max(gs - 1, 0)
    lo = v if min_gs is None else min_gs
    hi = max(v, lo) if max_gs is None else max_gs
    buf.register(partition=partition, uids=[uid], global_steps=gs, n=n)
    rows = [traj(uid, s, partition=partition, min_gs=lo, max_gs=hi, reward=r)
            for s, r in enumerate(rewards)]
    if rows:
        buf.put(rows)
    if status != "pending":
        buf.update_status(partition=partition, uids=[uid], status="running")
    if status in ("finished", "failure"):
        buf.update_status(partition=partition, uids=[uid], status=status)
    return rows


def small_trained_lake(lake: Path) -> Path:
    """A small real lake: 3 groups of 2 trajectories at step 1, 2 of them trained and
    released (what command-line error tests run against)."""
    with ReplayBuffer.sync(lake=lake, poll_interval=0.01) as buf:
        for i in range(3):
            add_group(buf, f"g{i}", 1)
        buf.release(buf.sample(1, "train", 2))
    return lake


def lake_history(lake: Path) -> dict[str, list[tuple]]:
    """Every lake table's rows without their wall-clock time, in seq order."""
    out = {}
    for name, schema in LAKE_TABLES.items():
        cols = [f.name for f in schema if f.name != "ts"]
        t = read_table(lake, name).select(cols)
        out[name] = list(zip(*(t[c].to_pylist() for c in cols)))
    return out


def lake_counts(lake: str | os.PathLike) -> dict[str, int]:
    """Rows of every lake table, read back from the files on disk."""
    return {name: read_table(lake, name).num_rows for name in LAKE_TABLES}


def write_script(directory: Path, name: str, source: str) -> Path:
    """Write a python script (dedented) to ``directory/name`` and return its path."""
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def python_env(**extra: str) -> dict[str, str]:
    """The environment for a child python: this repo importable, plus ``extra`` variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_python(script: Path, *args: str, timeout: float = 60, **env: str
               ) -> subprocess.CompletedProcess:
    """Run ``script`` with the venv's interpreter to completion; raise if it fails."""
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=python_env(**env), cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"{script.name} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def write_apart() -> None:
    """Make this process's buffers write as replaylake did before 2026-12, for tests of lakes
    that version left behind: every table of a change its own write, and a sync DAPO call's
    surplus discards apart from its selection (so a crash could fall between them). Call it in
    a child process only: it changes `BufferState` for the whole process."""
    from pipeline.state import BufferState, Columns
    one = BufferState.commit_many

    def apart(self, items):
        done = []
        for table, rows in items:
            kinds = rows.column("kind") if table == "decisions" and isinstance(rows, Columns) \
                else []
            cut = kinds.count("discard") if kinds and kinds[0] == "discard" else 0
            if 0 < cut < len(kinds):
                values = {k: rows.column(k) for k in rows.values}
                for a, b in ((0, cut), (cut, len(kinds))):
                    done += one(self, [(table, Columns(table, b - a, {
                        k: v[a:b] for k, v in values.items()}))])
            else:
                done += one(self, [(table, rows)])
        return done
    BufferState.commit_many = apart
