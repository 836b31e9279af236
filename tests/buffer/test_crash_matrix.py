"""The crash matrix: the buffer killed (SIGKILL) at every write point of its lake writer — every
write, checksum record and fsync of every table and of the writer's log, torn halfway or whole,
new directories and files — during ingest over two partitions, status changes, samples that evict,
refill, select and discard, and releases. After each kill, a restart must hold exactly the
acknowledged history up to a whole write, equal the untouched run's live state, keep writing, and
pass every audit (see jobs/dev/kill_matrix.py; `replaylake dev soak` runs the same matrix
thousands of times)."""
from __future__ import annotations

import shutil

import pytest

from jobs.dev import kill_matrix
from pipeline import ReplayBuffer
from pipeline.lake.damage import check
from pipeline.lake.files import sum_path
from pipeline.lake.read import LakeDamageError
from pipeline.lake.recovery import salvage
from pipeline.lake.writer import segment_files
from tests.support.lake_damage import write_ends, zero_bytes

WORKERS = 2
KINDS = {"mkdir", "create", "data_torn", "data_written", "sum_torn", "sum_written", "acked"}
SYNC_KINDS = {"dir_synced", "data_synced", "sum_synced"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("matrix")


@pytest.fixture(scope="module")
def refs(workdir):
    return {(kind, fsync): kill_matrix.reference(kind, workdir, fsync=fsync)
            for kind, fsync in (("async", False), ("sync", False), ("async", True))}


def kinds_of(chosen: list[str]) -> set[str]:
    return {t.rsplit(":", 1)[0].split(".", 1)[1] for t in chosen}


def chosen(refs, which: str) -> list[str]:
    """The kill targets each matrix test runs: every other point of the async workload, every
    third of the sync one, every fourth point around an fsync (the soak job runs them all)."""
    if which == "fsync":
        every = kill_matrix.targets(refs["async", True])
        return [t for t in every if kinds_of([t]) & SYNC_KINDS][::4]
    return kill_matrix.targets(refs[which, False])[{"async": slice(0, None, 2),
                                              "sync": slice(1, None, 3)}[which]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_kill_points_of_each_workload_restart_exactly(refs, workdir, kind):
    targets = chosen(refs, kind)
    assert kinds_of(targets) == KINDS
    assert {t.split(".", 1)[0] for t in targets} >= {"trajectories", "group_events", "decisions",
                                                     "metrics", "log"}
    assert kill_matrix.run_matrix(refs[kind, False], workdir / kind, targets, workers=WORKERS) == []


@pytest.mark.slow
def test_kill_points_around_each_fsync_restart_exactly(refs, workdir):
    targets = chosen(refs, "fsync")
    assert kinds_of(targets) == SYNC_KINDS
    assert kill_matrix.run_matrix(refs["async", True], workdir / "fsync", targets,
                           workers=WORKERS) == []


def test_the_matrix_kills_at_least_300_times(refs):
    assert sum(len(chosen(refs, w)) for w in ("async", "sync", "fsync")) >= 300


def test_the_workloads_write_every_decision_kind(refs):
    import json
    kinds = {json.loads(row)["kind"] for ref in refs.values() for _, t, row in ref.history
             if t == "decisions"}
    assert kinds >= {"evict", "refill", "select", "discard", "release"}


def test_no_kill_point_parts_a_polls_evictions_from_the_refill_they_earn(refs):
    """A crash ends the history at the end of some write; a poll's `evict` rows and its
    `refill` / `refill_deferred` rows are one write, so no crash keeps an eviction and loses the
    ask for its replacement (which a restarted buffer would never make)."""
    import json
    parted, earned = [], {}
    for (kind, fsync), ref in refs.items():
        polls: dict[tuple, list[tuple[int, str]]] = {}
        for seq, table, row in ref.history:
            r = json.loads(row) if table == "decisions" else None
            if r is not None and r["kind"] in ("evict", "refill", "refill_deferred"):
                polls.setdefault((r["partition"], r["call_id"], r["poll"]), []).append(
                    (seq, r["kind"]))
        for key, rows in polls.items():
            kinds = {k for _, k in rows}
            if "evict" not in kinds or kinds == {"evict"}:
                continue
            earned[kind] = earned.get(kind, 0) + 1
            first, last = min(s for s, _ in rows), max(s for s, _ in rows)
            parted += [(kind, fsync, key, b) for b in ref.boundaries if first <= b < last]
    assert earned.get("async", 0) >= 2, earned   # (sync DAPO's credit is asked in later polls)
    assert parted == []


def test_no_kill_point_parts_a_selection_from_its_discards_or_its_metric_rows(refs):
    """A selection's `select` rows, the surplus a sync DAPO call discards with it and the
    batch's metric rows are one write: no crash keeps a batch without the metrics it reported
    (or a discard without the selection that made it surplus)."""
    import json
    parted, seen = [], {"discard": 0, "metrics": 0}
    for (kind, fsync), ref in refs.items():
        calls: dict[tuple, list[int]] = {}
        batch_call: dict[tuple, tuple] = {}
        rows = [(seq, table, json.loads(row)) for seq, table, row in ref.history]
        for seq, table, r in rows:
            if table == "decisions" and r["kind"] == "select":
                key = (r["partition"], r["call_id"], r["poll"])
                batch_call[r["partition"], r["batch_id"]] = key
                calls.setdefault(key, []).append(seq)
        for seq, table, r in rows:
            if table == "decisions" and r["kind"] == "discard":
                key = (r["partition"], r["call_id"], r["poll"])
                if key in calls:
                    calls[key].append(seq)
                    seen["discard"] += 1
            elif table == "metrics" and r["batch_id"] is not None:
                calls[batch_call[r["partition"], r["batch_id"]]].append(seq)
                seen["metrics"] += 1
        for key, seqs in calls.items():
            parted += [(kind, fsync, key, b) for b in ref.boundaries
                       if min(seqs) <= b < max(seqs)]
    assert seen["discard"] >= 1 and seen["metrics"] >= 10, seen
    assert parted == []


def _killed_lake(refs, workdir, target: str):
    ref = refs["async", False]
    lake = workdir / "damage" / target.replace(":", "-")
    kill_matrix.kill_at(ref, target, lake)
    return ref, lake


@pytest.mark.parametrize("at", [0.4, 0.7, 0.95])
def test_a_corrupted_middle_after_a_kill_is_refused_then_salvaged(refs, workdir, at):
    ref = refs["async", False]
    every = kill_matrix.targets(ref)
    target = next(t for t in every[int(len(every) * at):] if "data_torn" in t)
    ref, lake = _killed_lake(refs, workdir, target)
    seg = max(segment_files(lake, "trajectories"), key=lambda p: len(write_ends(p)))
    ends = write_ends(seg)
    middle = ends[len(ends) // 2 - 1]
    zero_bytes(seg, middle + 3, 16)
    with pytest.raises(LakeDamageError) as err:
        kill_matrix.history(lake)
    assert (err.value.path, err.value.offset) == (seg, middle)
    del err
    report = salvage(lake)
    assert report.lost_writes == 1 and report.kept_writes == len(ends) - 1
    assert check(lake).damaged == []
    buf, _ = kill_matrix.open_buffer("async", lake, False, ref.seed)
    buf.close()


def test_a_missing_file_after_a_kill_is_refused_then_salvaged(refs, workdir):
    ref = refs["async", False]
    every = kill_matrix.targets(ref)
    target = next(t for t in every[len(every) // 2:] if "sum_torn" in t)
    ref, lake = _killed_lake(refs, workdir, target)
    [seg, *_] = segment_files(lake, "metrics")
    seg.unlink()
    sum_path(seg).unlink()
    try:
        ReplayBuffer.async_(lake=lake)
    except LakeDamageError as exc:
        assert exc.path == seg and "missing" in str(exc)
    else:
        raise AssertionError("a lake with a missing segment was opened")
    salvage(lake)
    assert check(lake).damaged == []
    buf, _ = kill_matrix.open_buffer("async", lake, False, ref.seed)
    buf.close()
    shutil.rmtree(lake)
