"""`replaylake dev big-lake` on a tiny size: it writes through the buffer, trains every step,
compacts as the scheduled job does, and a second session goes on with the same lake."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobs.dev.big_lake import write
from pipeline.analysis import connect

ROOT = Path(__file__).resolve().parents[3]
TINY = dict(groups=16, n=4, tokens=(20, 40), batch=4, compact_every=2, seed=1)


def test_a_tiny_big_lake_trains_every_step_and_is_compacted(tmp_path):
    lake = tmp_path / "lake"
    got = write(lake, steps=3, **TINY)
    assert got == {"steps": 3, "groups": 48, "trajectories_put": 192, "groups_trained": 12,
                   "short_steps": 0}
    assert not [p for p in lake.rglob("*.arrow") if "_log" not in p.parts]   # all compacted
    more = write(lake, steps=2, first_step=4, **TINY)
    assert (more["groups_trained"], more["short_steps"]) == (8, 0)
    con = connect(lake)
    assert con.sql("select count(distinct step) from decisions where kind = 'select'"
                   ).fetchall() == [(5,)]
    [(failed, put)] = con.sql("select count(*) filter (where event = 'failure'), "
                          "(select count(*) from trajectories) from group_events").fetchall()
    assert put == (80 - failed) * 4
    [lengths] = con.sql("select min(n_response_tokens), max(n_response_tokens), "
                      "count(*) filter (where rollout_log_probs is null) from trajectories"
                        ).fetchall()
    assert 20 <= lengths[0] <= lengths[1] <= 40 and lengths[2] == 0


def test_the_command_refuses_an_existing_lake_and_a_missing_one_to_go_on_with(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jobs.cli", "dev", "big-lake", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    (tmp_path / "lake").mkdir()
    got = run("--lake", str(tmp_path / "lake"), "--steps", "1")
    assert got.returncode == 2 and "exists" in got.stderr
    got = run("--lake", str(tmp_path / "none"), "--steps", "1", "--first-step", "3")
    assert got.returncode == 2 and "no lake" in got.stderr


def test_its_log_probs_are_never_positive_even_where_the_draw_is_nearest_one():
    """The generator's log-probs are log(uniform) drawn in float32: a draw just below 1 plus a
    floor of 1e-6 once rounded above 1 and made the put refuse a positive log-probability (an
    8-step lake failed at its first step)."""
    import numpy as np
    import pyarrow.compute as pc

    from jobs.dev.big_lake import _table
    rng = np.random.default_rng(0)
    t = _table([f"u{i}" for i in range(64)], np.zeros(64, dtype=np.int64), 16, (2000, 4000), rng)
    assert pc.max(pc.list_flatten(t["rollout_log_probs"])).as_py() <= 0
