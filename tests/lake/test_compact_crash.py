"""Compaction and retention killed (SIGKILL) at every point where they write: a temporary Parquet
file half written, complete but not renamed, renamed before its segment is deleted, a segment
deleted before its checksum file; a retention's rewrite complete but not renamed, renamed into
place under its new name before the file it rewrote is deleted, and after that delete.

After each kill, before anything is repaired, every reader must see exactly the lake it saw
before the job (every acknowledged row once, the same query answers, no damage), and a connection
made before the job must go on answering exactly as it did; a re-run of the job must then finish
it, leaving exactly what an untouched run leaves (the same files), and a buffer must restore the
same state from it."""
from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest

from jobs.dev.soak_jobs import answers as ask
from jobs.dev.soak_jobs import parquet_names
from pipeline import ReplayBuffer
from pipeline.analysis.views import connect
from pipeline.lake import kill as lake_kill
from pipeline.lake.compaction import compact
from pipeline.lake.damage import check
from pipeline.lake.names import superseded
from pipeline.lake.retention import EMPTIED, NULLED, retain
from pipeline.lake.writer import highest_seq, segment_files
from schemas import LAKE_TABLES
from tests.support.lake import lake_history
from tests.support.sql_runs import simulate_async

OLDER_THAN = 3
ROLL = 16384               # bytes: the run rolls its segments often, so there are many to compact

QUERIES = [
    "select count(*), count(distinct seq), sum(reward) from trajectories",
    "select uid, session_id, min_global_steps, max_global_steps, reward from trajectories "
    "order by seq",
    "select kind, count(*) from decisions group by kind order by kind",
    "select partition, uid, fate from groups order by partition, uid",
    "select * from off_policy order by all",
]
PAYLOAD = "select uid, session_id, len(response_ids), response_ids from trajectories order by seq"


def answers(lake: Path, payload: bool = True, con=None) -> list[list[tuple]]:
    """The queries' answers, on a fresh connection (or ``con``, which is left open)."""
    return ask(lake, con, QUERIES + ([PAYLOAD] if payload else []))


def restored_counts(lake: Path) -> dict[str, dict]:
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2, filter_groups_metric="reward",
                             refill_fn=lambda *args, **kwargs: None) as buf:   # never sampled
        return {p: dict(buf.counts(p)) for p in ("train", "val")}


def leftovers(lake: Path) -> list[Path]:
    """Segments, lone checksum files, temporary files and files a newer rewrite replaces:
    nothing a finished job leaves."""
    out = [p for t in LAKE_TABLES for p in segment_files(lake, t) if p.suffix == ".arrow"]
    for t in LAKE_TABLES:
        out += list((lake / t).rglob("*.crc")) + list((lake / t).rglob(".*.tmp"))
        out += superseded(segment_files(lake, t))
    return out


def traced(job) -> list[str]:
    """The kill points ``job()`` reaches, in order (run here, nothing killed)."""
    os.environ[lake_kill.ENV] = "trace"
    try:
        lake_kill.arm()
        job()
        return lake_kill.trace()
    finally:
        del os.environ[lake_kill.ENV]
        lake_kill.arm()


def targets(trace: list[str]) -> list[str]:
    """Every point of the trace at its first, middle and last occurrence."""
    out = []
    for point, n in Counter(trace).items():
        out += [f"{point}:{k}" for k in sorted({1, (n + 1) // 2, n})]
    return out


def _job(job: str, lake: str, target: str) -> None:
    """In a fresh child: run the job with ``target`` armed; it must die there (exit 3 if not)."""
    os.environ[lake_kill.ENV] = target
    lake_kill.arm()
    if job == "compact":
        compact(lake)
    else:
        retain(lake, OLDER_THAN)
    os._exit(3)


def kill(job: str, lake: Path, target: str) -> None:
    ctx = multiprocessing.get_context("forkserver")   # no thread pools copied from this process
    proc = ctx.Process(target=_job, args=(job, str(lake), target))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL, f"{job} at {target}: exit {proc.exitcode}"


def without_payload(history: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    cols = [f.name for f in LAKE_TABLES["trajectories"] if f.name != "ts"]
    drop = {cols.index(c) for c in (*EMPTIED, *NULLED)}
    out = dict(history)
    out["trajectories"] = [tuple(v for i, v in enumerate(r) if i not in drop)
                           for r in history["trajectories"]]
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished run's lake (many rolled segments), compacted and retained untouched once."""
    work = tmp_path_factory.mktemp("jobs_crash")
    lake = work / "base"

    def roll(buf, step, partition, when):
        buf.lake.roll_bytes = ROLL

    simulate_async(lake, steps=8, surplus=1, checkpoint=roll)
    compacted, retained = work / "compacted", work / "retained"
    shutil.copytree(lake, compacted)
    compact_trace = traced(lambda: compact(compacted))
    shutil.copytree(compacted, retained)
    retain_trace = traced(lambda: retain(retained, OLDER_THAN))
    return {
        "work": work, "lake": lake, "compacted": compacted, "retained": retained,
        "history": lake_history(lake), "answers": answers(lake), "top": highest_seq(lake),
        "counts": restored_counts(shutil.copytree(lake, work / "counted")),
        "retained_history": lake_history(retained), "retained_answers": answers(retained),
        "names": parquet_names(compacted), "retained_names": parquet_names(retained),
        "compact_trace": compact_trace, "retain_trace": retain_trace,
    }


def test_the_jobs_reach_every_kill_point(base):
    assert len(segment_files(base["lake"], "trajectories")) > 5
    assert set(base["compact_trace"]) == {"compact.tmp_partial", "compact.tmp_written",
                                          "compact.renamed", "compact.segment_deleted",
                                          "compact.deleted"}
    assert set(base["retain_trace"]) == {"retain.tmp_written", "retain.renamed",
                                         "retain.deleted"}
    assert base["retained_history"] != base["history"]      # retention dropped some payload
    assert without_payload(base["retained_history"]) == without_payload(base["history"])


def test_a_compaction_killed_anywhere_changes_nothing_and_a_rerun_finishes_it(base):
    chosen = targets(base["compact_trace"])
    assert len(chosen) >= 12
    for target in chosen:
        lake = base["work"] / f"compact-{target.replace(':', '-')}"
        shutil.copytree(base["lake"], lake)
        held = connect(lake)                    # a reader that connected before the job
        kill("compact", lake, target)
        assert lake_history(lake) == base["history"], target        # read before any repair
        assert check(lake).damaged == [], target
        assert answers(lake) == base["answers"], target
        assert answers(lake, con=held) == base["answers"], target
        compact(lake)
        assert leftovers(lake) == [], target
        assert parquet_names(lake) == base["names"], target
        assert lake_history(lake) == base["history"], target
        assert answers(lake) == base["answers"], target
        assert answers(lake, con=held) == base["answers"], target
        held.close()
        assert highest_seq(lake) == base["top"], target
        assert check(lake).findings == [], target
        assert restored_counts(lake) == base["counts"], target
        shutil.rmtree(lake)


def test_a_retention_killed_anywhere_keeps_every_row_and_a_rerun_finishes_it(base):
    chosen = targets(base["retain_trace"])
    assert len(chosen) >= 4
    meta = base["answers"][:-1]
    for target in chosen:
        lake = base["work"] / f"retain-{target.replace(':', '-')}"
        shutil.copytree(base["compacted"], lake)
        held = connect(lake)                    # a reader that connected before the job
        before = answers(lake, con=held)
        kill("retain", lake, target)
        assert answers(lake, con=held) == before, target            # still the lake it saw
        mid = lake_history(lake)
        assert without_payload(mid) == without_payload(base["history"]), target
        for row, old, new in zip(mid["trajectories"], base["history"]["trajectories"],
                                 base["retained_history"]["trajectories"]):
            assert row in (old, new), target        # each row whole: its payload, or none
        assert check(lake).damaged == [], target
        assert answers(lake, payload=False) == meta, target
        retain(lake, OLDER_THAN)
        assert answers(lake, con=held) == before, target
        held.close()
        assert leftovers(lake) == [], target
        assert parquet_names(lake) == base["retained_names"], target
        assert lake_history(lake) == base["retained_history"], target
        assert answers(lake) == base["retained_answers"], target
        assert check(lake).findings == [], target
        assert restored_counts(lake) == base["counts"], target
        shutil.rmtree(lake)
