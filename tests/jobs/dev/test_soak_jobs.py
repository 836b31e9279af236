"""The soak's job rounds: compaction and retention killed at each of their points on a crash
workload's finished lake; after every kill the readers see the lake they saw before the job, a
re-run finishes it exactly, and a restart holds (the soak job runs every occurrence of every
point, on every workload; this runs each point once)."""
from __future__ import annotations

from collections import Counter

import pytest

from jobs.dev import kill_matrix
from jobs.dev.soak_jobs import HORIZONS, job_reference, job_targets, run_jobs

POINTS = {"compact.tmp_partial", "compact.tmp_written", "compact.renamed",
          "compact.segment_deleted", "compact.deleted",
          "retain.tmp_written", "retain.renamed", "retain.deleted"}


@pytest.fixture(scope="module")
def jref(tmp_path_factory):
    work = tmp_path_factory.mktemp("soak_jobs")
    return job_reference(kill_matrix.reference("async", work), work), work


def test_the_jobs_reach_every_point_on_a_workload_lake_and_retention_rewrites_files_again(jref):
    ref, _ = jref
    seen = Counter(t.rsplit(":", 1)[0] for _, t in job_targets(ref))
    assert set(seen) == POINTS
    assert seen["compact.renamed"] >= 5                     # several segments compacted
    # retention at several horizons in a row rewrites a file into a later generation
    trajectory_files = [n for n in ref.names["retain"] if n.startswith("trajectories/")]
    assert len(HORIZONS) > 1 and seen["retain.renamed"] > len(trajectory_files)
    assert any(".r2.parquet" in n or ".r3.parquet" in n for n in trajectory_files)


@pytest.mark.slow
def test_each_job_point_killed_once_leaves_readers_and_restarts_correct(jref):
    ref, work = jref
    by_point: dict[str, list[tuple[str, str]]] = {}
    for target in job_targets(ref):
        by_point.setdefault(target[1].rsplit(":", 1)[0], []).append(target)
    middle = {p: ts[len(ts) // 2] for p, ts in by_point.items()}
    assert set(middle) == POINTS
    assert run_jobs(ref, work / "kills", list(middle.values()), workers=2) == []
