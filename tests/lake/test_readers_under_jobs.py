"""Readers running beside compaction and retention: every query answers, and every answer is one
of the lake's consistent states.

A reader may hold a connection made before the job started (the nightly retention overlapping an
hourly audit or a long SQL session), connect while the job runs, read tables through the lake
reader, run the audits, gather a report or check the lake. Compaction replaces open segments by
Parquet copies and retention rewrites Parquet files; neither may make a reader fail, count a row
twice or miss one, or see a row with half its payload."""
from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from jobs.audit import run_audits
from pipeline.analysis.report.data import gather
from pipeline.analysis.views import connect
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.names import next_generation
from pipeline.lake.read import current_files
from pipeline.lake.retention import retain
from pipeline.lake.writer import highest_seq, read_table
from tests.lake.test_compact_crash import QUERIES, ROLL, without_payload
from tests.support.lake import lake_history
from tests.support.sql_runs import simulate_async

PAYLOAD = "select seq, len(response_ids), response_ids, rollout_log_probs is null " \
          "from trajectories order by seq"
HORIZONS = (6, 5, 4, 3, 2, 1, 0)      # each retention run drops the payload of more groups


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished run's lake of many rolled segments, what readers see of it, and each row's
    payload before and after the last retention run."""
    work = tmp_path_factory.mktemp("readers")
    lake = work / "base"

    def roll(buf, step, partition, when):
        buf.lake.roll_bytes = ROLL

    simulate_async(lake, steps=8, surplus=1, checkpoint=roll)
    done = shutil.copytree(lake, work / "done")
    compact(done)
    for h in HORIZONS:
        retain(done, h)
    con = connect(lake)
    meta = [con.sql(q).fetchall() for q in QUERIES]
    before = con.sql(PAYLOAD).fetchall()
    con.close()
    after = connect(done).sql(PAYLOAD).fetchall()
    assert len(before) == len(after) and before != after
    return {"work": work, "lake": lake, "meta": meta, "history": without_payload(
        lake_history(lake)), "rows": {r[0]: (r, a) for r, a in zip(before, after)},
        "report": gather(lake).partitions, "top": highest_seq(lake)}


PHASES = ("before", "compaction", "retention", "after")


class Readers:
    """Reader threads asking the lake in a loop. Each read is counted in every phase it
    overlapped; every failure and wrong answer is kept."""

    def __init__(self, lake: Path, base: dict):
        self.lake, self.base = lake, base
        self.at = 0                         # index of the phase now running
        self.reads: Counter[tuple[str, str]] = Counter()     # (phase, kind of read)
        self.problems: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(ask,), daemon=True)
                        for ask in (self._held, self._fresh, self._jobs)]

    def __enter__(self) -> Readers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def next_phase(self) -> None:
        self.at += 1

    def _loop(self, ask) -> None:
        state: dict = {}
        while not self.stop.is_set():
            start = self.at
            try:
                problem = ask(state)
            except Exception as e:          # noqa: BLE001 (a failed read is what is counted)
                problem = f"{type(e).__name__}: {e}"
            for phase in PHASES[start:self.at + 1]:
                self.reads[(phase, ask.__name__)] += 1
            if problem:
                self.problems.append(f"{PHASES[start]} {ask.__name__}: {problem}")

    def _answers(self, con) -> str | None:
        """Six SQL queries: the same metadata answers as before any job, every row once, each
        with its whole payload or none of it."""
        if [con.sql(q).fetchall() for q in QUERIES] != self.base["meta"]:
            return "metadata answers differ"
        rows = con.sql(PAYLOAD).fetchall()
        if [r[0] for r in rows] != sorted(self.base["rows"]):
            return "not every row exactly once"
        bad = [r[0] for r in rows if r not in self.base["rows"][r[0]]]
        return f"rows {bad[:3]} have a payload no state had" if bad else None

    def _held(self, state: dict) -> str | None:
        """A connection made as each phase starts (before the jobs, as compaction starts, as
        retention starts), asked again and again while the job runs."""
        if state.get("at") != self.at:
            state["at"], state["con"] = self.at, connect(self.lake)
        return self._answers(state["con"])

    def _fresh(self, state: dict) -> str | None:
        """A connection per read; the lake reader's tables and highest seq."""
        con = connect(self.lake)
        try:
            problem = self._answers(con)
        finally:
            con.close()
        if problem is None and without_payload(lake_history(self.lake)) != self.base["history"]:
            return "the lake reader's history differs"
        if problem is None and highest_seq(self.lake) != self.base["top"]:
            return "the highest seq differs"
        return problem

    def _jobs(self, state: dict) -> str | None:
        """The audits, the report and the checker."""
        failed = [a.name for a in run_audits(self.lake) if a.status == "FAIL"]
        if failed:
            return f"audits failed: {failed}"
        if gather(self.lake).partitions != self.base["report"]:
            return "the report differs"
        damaged = check(self.lake).damaged
        return f"check found {damaged[:2]}" if damaged else None


def test_readers_never_fail_nor_see_a_mixture_while_compaction_and_retention_run(base):
    reads: Counter[tuple[str, str]] = Counter()
    problems: list[str] = []
    for round_ in range(2):
        lake = shutil.copytree(base["lake"], base["work"] / f"lake{round_}")
        with Readers(lake, base) as readers:
            time.sleep(0.5)                 # every reader is planning over the untouched lake
            readers.next_phase()
            compact(lake)
            readers.next_phase()
            for h in HORIZONS:
                retain(lake, h)
            readers.next_phase()
            time.sleep(0.5)
        reads.update(readers.reads)
        problems += readers.problems
        shutil.rmtree(lake)
    sql = {p: 6 * (reads[(p, "_held")] + reads[(p, "_fresh")]) for p in PHASES}
    print(f"\nSQL queries answered: {sql}; audit+report+check runs: "
          f"{ {p: reads[(p, '_jobs')] for p in PHASES} }; failed or wrong: {len(problems)}")
    assert problems == [], "\n".join(p[:300] for p in problems[:5])
    assert sql["compaction"] >= 12 and sql["retention"] >= 36
    assert reads[("retention", "_jobs")] >= 2


def test_a_reader_listing_a_large_directory_while_a_segment_changes_files_misses_no_row(base):
    """A directory too large for one read is listed in several, each seeing it at another
    moment: a listing taken while a job renames a segment's next file in and deletes the one
    before can hold neither. Here one trajectory segment goes from generation to generation (a
    new name for its file, then the old name removed, as retention does) in a tight loop, in a
    window directory of 3,000 entries; readers must still count each of its rows once."""
    lake = shutil.copytree(base["lake"], base["work"] / "large")
    compact(lake)
    want = read_table(lake, "trajectories").column("seq").to_pylist()
    first = next(p for p in current_files(lake, "trajectories") if p.suffix == ".parquet")
    for i in range(3000):                   # entries readers ignore, only to make it large
        (first.parent / f"pad-{i:05d}").touch()
    stop = threading.Event()

    def job() -> None:
        cur = first
        while not stop.is_set():
            new = next_generation(cur)
            os.link(cur, new)               # the same rows under the next generation's name
            os.unlink(cur)
            cur = new
            time.sleep(0.0002)              # let the readers' thread run

    t = threading.Thread(target=job)
    t.start()
    wrong, reads, until = 0, 0, time.monotonic() + 3
    try:      # at least 3 s and 5 reads (a loaded machine reads slower), at most 60 s
        while (time.monotonic() < until or reads < 5) and time.monotonic() < until + 57:
            reads += 1
            wrong += read_table(lake, "trajectories").column("seq").to_pylist() != want
            wrong += highest_seq(lake) != base["top"]
    finally:
        stop.set()
        t.join(30)
    print(f"\n{reads} reads beside {first.name}'s changing files: {wrong} wrong")
    assert reads >= 5 and wrong == 0
