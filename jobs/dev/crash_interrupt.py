"""The interrupt matrix: Ctrl-C, or a failing disk, at every lake write point of a process that goes on.

The crash matrix kills the process at each write point of the crash workloads
(`jobs.dev.crash_workload`); this one strikes there and lets the process carry on, as a notebook
user who presses Ctrl-C during a call and runs the cell again would. Two ways to strike
(`pipeline.lake.kill`'s ``REPLAYLAKE_KILL_HOW``): ``interrupt`` sends the process SIGINT right
there (Python raises KeyboardInterrupt at its next chance), ``raise`` raises an `OSError` right
there (after the half write of a torn point), as a disk that fails at that step would.

Each strike runs the workload in a fresh process, every buffer call through `Retrying`:

1. a call that raises must leave the buffer as it was before the call or as the untouched run
   left it after the call (a `sample` may also have kept the evictions of its earlier polls);
   a call that did not complete is run again and must then succeed;
2. after every call the live state equals the untouched run's after the same call;
3. the lake then holds the untouched run's history row for row (seq numbers, call ids and poll
   numbers aside: a failed write burns its seqs, a retried sample is a new call; a refill that
   the strike stopped is a `refill` row with its `refill_failed` row, set aside here, and the
   retry's own `refill` row),
4. reopening the lake restores the same state, and every audit of `sql/audits/` passes.

The strike at ``<table>.acked`` only runs as an interrupt: it marks the end of a write that is
already whole, where no real failure can be raised.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.dev.crash_workload import (
    THRESHOLD,
    Reference,
    history,
    open_buffer,
    state,
    targets,
    workload,
)

HOWS = ("interrupt", "raise")
_SINGLE = ("register", "update_status", "put", "release")   # one lake write each


def applies(target: str, how: str) -> bool:
    """Whether a strike of ``how`` at ``target`` is run (see the module doc)."""
    return how == "interrupt" or ".acked:" not in target


class Retrying:
    """The buffer as the workload sees it: a call that raises is checked and, unless it had
    completed, run again (what a user does after Ctrl-C). ``calls`` counts acknowledged calls."""

    def __init__(self, buf: Any, ref: Reference, problems: list[str]):
        self._buf, self._ref, self._problems = buf, ref, problems
        self.calls = 0
        self.strikes: list[str] = []
        self._in_sample = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buf, name)

    def mark(self, _buf: Any) -> None:
        self.calls += 1
        if state(self._buf) != self._ref.states[self.calls]:
            self._problems.append(f"after call {self.calls}: the live state is not the "
                                  "untouched run's")

    def _done(self, name: str, args: tuple, kwargs: dict) -> bool:
        """Whether the call ``name`` that raised had completed after all."""
        buf = self._buf
        if name == "release":
            b = args[0]
            return b.batch_id not in buf.held_batches(b.partition)
        if name == "put":
            return all(r["session_id"] in buf.lookup(r["partition"], r["uid"]).sessions
                       for r in args[0])
        if name == "register":
            rows = args[0] if args else {"partition": [kwargs["partition"]] * len(kwargs["uids"]),
                                         "uid": kwargs["uids"]}
            return all(buf.lookup(p, u) is not None for p, u in zip(rows["partition"],
                                                                    rows["uid"]))
        return all(buf.lookup(kwargs["partition"], u).status == kwargs["status"]
                   for u in kwargs["uids"])

    def _retry(self, name: str, args: tuple, kwargs: dict) -> Any:
        fn = getattr(self._buf, name)
        before = state(self._buf) if name in _SINGLE and not self._in_sample else None
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, OSError) as exc:
            self.strikes.append(f"{name}: {type(exc).__name__}")
            if before is not None:
                after = state(self._buf)
                if after != before and after != self._ref.states[self.calls + 1]:
                    self._problems.append(f"call {self.calls + 1} ({name}) raised {exc!r} and "
                                          "left the buffer half changed")
            if name in _SINGLE and self._done(name, args, kwargs):
                return None
            return fn(*args, **kwargs)

    def register(self, *args: Any, **kwargs: Any) -> Any:
        return self._retry("register", args, kwargs)

    def update_status(self, *args: Any, **kwargs: Any) -> Any:
        return self._retry("update_status", args, kwargs)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        return self._retry("put", args, kwargs)

    def release(self, *args: Any, **kwargs: Any) -> Any:
        return self._retry("release", args, kwargs)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        self._in_sample = True
        try:
            return self._retry("sample", args, kwargs)
        finally:
            self._in_sample = False

    def close(self) -> None:
        try:
            self._buf.close()
        except (KeyboardInterrupt, OSError) as exc:
            self.strikes.append(f"close: {type(exc).__name__}")
            self._buf.close()


def comparable(rows: list[tuple]) -> list[tuple[str, str]]:
    """A history without what a retry changes (see the module doc, point 3)."""
    decoded = [(t, json.loads(r)) for _, t, r in rows]
    failed = {(r["partition"], r["call_id"], r["poll"]) for t, r in decoded
              if t == "decisions" and r["kind"] == "refill_failed"}
    out = []
    for t, r in decoded:
        if t == "decisions" and (r["kind"] == "refill_failed" or (
                r["kind"] == "refill" and (r["partition"], r["call_id"], r["poll"]) in failed)):
            continue
        for k in ("seq", "call_id", "poll"):
            r.pop(k, None)
        out.append((t, json.dumps(r, sort_keys=True)))
    return out


def strike(ref: Reference, target: str, how: str, lake: Path) -> tuple[list[str], list[str]]:
    """Run the workload with a strike at ``target``: (the problems found, empty if it held;
    the calls that raised, e.g. ``put: KeyboardInterrupt``)."""
    from jobs.audit import run_audits
    from pipeline.lake import kill as lake_kill
    shutil.rmtree(lake, ignore_errors=True)
    problems: list[str] = []
    box: dict[str, Retrying] = {}

    def wrap(buf: Any) -> Retrying:
        box["r"] = Retrying(buf, ref, problems)
        return box["r"]

    os.environ[lake_kill.ENV], os.environ[lake_kill.HOW_ENV] = target, how
    try:
        workload(ref.kind, lake, ref.fsync, ref.seed, lambda b: box["r"].mark(b), wrap)
    except BaseException as exc:
        return [f"{target} ({how}): the run broke: {exc!r}\n{traceback.format_exc()}"], []
    finally:
        del os.environ[lake_kill.ENV], os.environ[lake_kill.HOW_ENV]
    if not box["r"].strikes:
        problems.append(f"{target} ({how}): no call raised (the strike never surfaced)")
    if comparable(history(lake)) != comparable(ref.history):
        problems.append(f"{target} ({how}): the lake's history is not the untouched run's")
    buf, _ = open_buffer(ref.kind, lake, ref.fsync, ref.seed)
    try:
        if state(buf) != ref.states[-1]:
            problems.append(f"{target} ({how}): the reopened buffer differs")
    finally:
        buf.close()
    failed = [a.name for a in run_audits(lake, THRESHOLD) if a.status == "FAIL"]
    if failed:
        problems.append(f"{target} ({how}): audits failed: {failed}")
    return ([p if p.startswith(target) else f"{target} ({how}): {p}" for p in problems],
            box["r"].strikes)


def _strike_each(ref: Reference, todo: list[tuple[str, str]], workdir: str
                 ) -> tuple[list[str], list[str]]:
    import logging
    logging.getLogger("replaylake").setLevel(logging.ERROR)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as in any Python program
    problems: list[str] = []
    struck: list[str] = []
    for target, how in todo:
        p, s = strike(ref, target, how, Path(workdir) / "struck")
        problems += p
        struck += s
    shutil.rmtree(workdir, ignore_errors=True)
    return problems, struck


def run_strikes(ref: Reference, todo: list[tuple[str, str]], workdir: Path, workers: int = 2,
                progress: Callable[[int], Any] | None = None) -> tuple[list[str], Counter]:
    """Strike at every (target, how) of ``todo``, each in a fresh process (spawned, so the
    struck process holds no state of this one): (the problems found, how often each kind of
    call raised, e.g. ``{"put: KeyboardInterrupt": 12, ...}``)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    chunks = [todo[i:i + 8] for i in range(0, len(todo), 8)]
    problems: list[str] = []
    struck: Counter = Counter()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max(workers, 1), mp_context=ctx) as pool:
        futures = {pool.submit(_strike_each, ref, chunk, str(workdir / f"i{i}")): len(chunk)
                   for i, chunk in enumerate(chunks)}
        for f in as_completed(futures):
            p, s = f.result()
            problems += p
            struck.update(s)
            if progress is not None:
                progress(futures[f])
    return problems, struck


def chosen(ref: Reference, every: int) -> list[tuple[str, str]]:
    """What a quick run strikes: the first occurrence of every point and then every
    ``every``-th target, each way that `applies` (the soak job strikes at all of them)."""
    first: set[str] = set()
    out = []
    for i, t in enumerate(targets(ref)):
        point = t.rsplit(":", 1)[0]
        if point not in first or i % every == 0:
            first.add(point)
            out += [(t, how) for how in HOWS if applies(t, how)]
    return out
