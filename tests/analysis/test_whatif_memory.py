"""A what-if replay streams its record: the memory its feed holds does not grow with the lake's
length.

Two recorded runs alike but for their length (the long one four times the short one's steps, many
segments each) are replayed, each in a fresh child process that does nothing else, with a small
window of seqs so that both span many windows. The feed's peak of Arrow memory (the record's rows
and the stand-in payload) must grow by a small part of what reading the record whole (as the
replay did before) grows by, and its Python objects by the bookkeeping per group and per call.
No time is measured."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import ReplayBuffer

ROOT = Path(__file__).resolve().parents[2]
SHORT, LONG = 40, 160          # steps
GROUPS, N = 6, 4               # groups a step, responses a group
WINDOW = 256                   # seqs per window of the record in the child
ROLL = 32 << 10                # segment size: a run's lake is many segments (64 MiB each)


def _run(lake: Path, steps: int) -> Path:
    """A recorded async run: six groups a step (one without reward variance, evicted by the
    filter), a batch of four groups sampled and released at every step, responses of 40 to 70
    tokens with log-probs."""
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                              filter_groups_metric="reward", refill_fn=lambda n: None,
                              poll_interval=0.001)
    buf.lake.roll_bytes = ROLL          # many segments, as a long run writes them
    with buf:
        for g in range(1, steps + 1):
            uids = [f"s{g}g{i}" for i in range(GROUPS)]
            buf.register(partition="train", uids=uids, global_steps=g - 1, n=N)
            buf.put([{"partition": "train", "uid": u, "session_id": s, "index": 0,
                      "min_global_steps": g - 1, "max_global_steps": g - 1,
                      "reward": 0.0 if i == 0 else float(s % 2), "prompt_ids": [1, 2, 3],
                      "response_ids": [7] * (40 + (g * 7 + i * 3 + s) % 31),
                      "rollout_log_probs": [-0.5] * (40 + (g * 7 + i * 3 + s) % 31),
                      "is_padding": False}
                     for i, u in enumerate(uids) for s in range(N)])
            buf.update_status(partition="train", uids=uids, status="finished")
            buf.release(buf.sample(g, "train", 4, timeout=10))
    return lake


@pytest.fixture(scope="module")
def lakes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("whatif_memory")
    return {"short": _run(root / "short", SHORT), "long": _run(root / "long", LONG)}


_MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from pipeline import ReplayBuffer
from pipeline.analysis.whatif import record
from pipeline.analysis.whatif.feed import Feed
from pipeline.analysis.whatif.outcome import Outcome
from pipeline.analysis.whatif.rerun import _replay_calls, chosen_settings
lake = Path(sys.argv[1])
if sys.argv[3] == "whole":      # the record read whole, as the replay read it before
    with record.Record(lake) as r:
        cols = {n: record.ds.field(n) for n in [*record.METADATA, "seq"]}
        t = r.scan.tables["trajectories"].to_table(columns=cols)
        e = r.scan.tables["group_events"].to_table()
        print(json.dumps({"whole": t.nbytes + e.nbytes, "rows": t.num_rows}))
    sys.exit(0)
_, settings = chosen_settings(lake, {})
tracemalloc.start()
holder = {}
# the replay's feed and sample calls, into a buffer without a lake of its own: what is measured
# is what the replay holds of its record, not the replay's lake writer
with record.Record(lake, window_seqs=int(sys.argv[2])) as r:
    r.check()
    calls, released = r.calls()
    buf = ReplayBuffer.async_(refill_fn=lambda n: holder["polls"].refill(n), poll_interval=0.001,
                              **settings)
    with buf:
        feed = Feed(buf, r, calls, released)
        got = Outcome()
        _replay_calls(buf, feed, calls, got, holder)
        feed.advance(None)
print(json.dumps({"arrow_peak": pa.default_memory_pool().max_memory(),
                  "py_peak": tracemalloc.get_traced_memory()[1],
                  "batches": [sorted(b) for b in got.batches],
                  "recorded": [sorted(c.uids) for c in calls if c.selected]}))
"""


def _measured(lake: Path, what: str) -> dict:
    got = subprocess.run([sys.executable, "-c", _MEASURE, str(lake), str(WINDOW), what],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_the_feed_holds_about_as_much_of_a_long_record_as_of_a_short_one(lakes):
    short, long = _measured(lakes["short"], "feed"), _measured(lakes["long"], "feed")
    for got, steps in ((short, SHORT), (long, LONG)):
        assert len(got["batches"]) == steps and got["batches"] == got["recorded"]
    whole = {k: _measured(lakes[k], "whole") for k in ("short", "long")}
    assert whole["long"]["rows"] == LONG * GROUPS * N
    # the long record read whole is more than the feed ever holds of it ...
    assert long["arrow_peak"] < whole["long"]["whole"], (long["arrow_peak"], whole)
    # ... and four times the length adds a small part of what it adds to the whole record
    # (what grows: 8 bytes a row for the scan's snapshot cut, a key a group, a few per call)
    grown = long["arrow_peak"] - short["arrow_peak"]
    assert grown < (whole["long"]["whole"] - whole["short"]["whole"]) / 4, (short, long, whole)
    # the Python objects: the buffer's and the feed's bookkeeping per group and per call, no
    # object per row
    assert long["py_peak"] < 2.2 * short["py_peak"], (short["py_peak"], long["py_peak"])
