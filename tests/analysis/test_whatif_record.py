"""What a replay reads of the recorded lake (metadata only, a stand-in payload of the recorded
lengths) and what it lets go (each batch when the recorded run released it)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import ReplayBuffer
from pipeline.analysis.views import read_lake
from pipeline.analysis.whatif.record import PAYLOAD, Record, stand_in
from pipeline.analysis.whatif.rerun import recorded, replay
from pipeline.lake import compact
from schemas import TRAJECTORIES_INPUT


def _run(lake: Path, steps: int = 6, release_last: bool = True) -> Path:
    """A recorded async run: two groups a step, answers of 0 to 3 tokens, log-probs reported by
    session 1 only; every batch released except (``release_last=False``) the last one."""
    buf = ReplayBuffer.async_(lake=lake, max_off_policy_threshold=3, filter_groups_metric=None,
                              poll_interval=0.001)
    with buf:
        for g in range(1, steps + 1):
            uids = [f"s{g}g{i}" for i in range(2)]
            buf.register(partition="train", uids=uids, global_steps=g - 1, n=2)
            buf.put([{"partition": "train", "uid": u, "session_id": s, "index": 0,
                      "min_global_steps": g - 1, "max_global_steps": g - 1,
                      "reward": float(s), "prompt_ids": [1, 2],
                      "response_ids": list(range(10, 10 + (g + i + s) % 4)),
                      "rollout_log_probs": [-0.5] * ((g + i + s) % 4) if s == 1 else None,
                      "is_padding": False}
                     for i, u in enumerate(uids) for s in range(2)])
            buf.update_status(partition="train", uids=uids, status="finished")
            batch = buf.sample(g, "train", 2, timeout=10)
            if release_last or g < steps:
                buf.release(batch)
    return lake


def read_metadata(lake: Path, window: int | None = None) -> dict[str, pa.Table]:
    """The recorded metadata of every window, joined (small lakes only)."""
    with Record(lake, window_seqs=window) as record:
        record.check()
        windows = list(record.windows())
    return {"group_events": pa.concat_tables([w[0] for w in windows]),
            "trajectories": pa.concat_tables([w[1] for w in windows])}


def test_a_compacted_record_reads_as_the_live_one_in_windows(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake", steps=12)
    live = read_metadata(lake)
    assert compact(lake).compacted
    for window in (None, 16):           # one window, and many: the rows and their order hold
        got = read_metadata(lake, window)
        for name in ("group_events", "trajectories"):
            assert got[name].equals(live[name]), name
    assert replay(lake, tmp_path / "replay").batches == recorded(lake).batches


def _keyed(t: pa.Table, column: str) -> dict[tuple[str, int], object]:
    return dict(zip(zip(t["uid"].to_pylist(), t["session_id"].to_pylist()),
                    t[column].to_pylist()))


def test_the_metadata_holds_no_token_payload_and_keeps_lengths(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake")
    meta = read_metadata(lake)["trajectories"]
    assert not set(PAYLOAD) & set(meta.column_names)
    whole = read_lake(lake, tables=("trajectories",))["trajectories"]
    assert meta["seq"].to_pylist() == whole["seq"].to_pylist()
    lengths = pc.list_value_length(whole["response_ids"]).cast(pa.int64())
    assert meta["n_response_tokens"].to_pylist() == lengths.to_pylist()
    assert 0 in lengths.to_pylist()         # an empty answer is a length too


def test_the_stand_in_sends_the_recorded_lengths_without_tokens(tmp_path: Path) -> None:
    meta = read_metadata(_run(tmp_path / "lake"))["trajectories"]
    made = stand_in(meta)
    assert made.schema.equals(TRAJECTORIES_INPUT)
    assert made["n_response_tokens"].to_pylist() == meta["n_response_tokens"].to_pylist()
    assert max(meta["n_response_tokens"].to_pylist()) > 0
    for name in ("prompt_ids", "response_ids"):
        assert pc.list_value_length(made[name]).to_pylist() == [0] * made.num_rows
    assert made["rollout_log_probs"].null_count == made.num_rows
    assert made["response_mask"].null_count == made.num_rows


def test_the_replay_stores_the_recorded_lengths_and_no_payload(tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake")
    got = replay(lake, tmp_path / "replay")
    rec = read_lake(lake, tables=("trajectories",))["trajectories"]
    out = read_lake(got.lake, tables=("trajectories",))["trajectories"]
    assert got.batches == recorded(lake).batches
    assert _keyed(out, "n_response_tokens") == _keyed(rec, "n_response_tokens")
    assert out["rollout_log_probs"].null_count == out.num_rows
    assert pc.sum(pc.list_value_length(out["response_ids"])).as_py() == 0    # no payload


def _released(lake: Path) -> list[list[str]]:
    dec = read_lake(lake, tables=("decisions",))["decisions"]
    rel = dec.filter(pc.equal(dec["kind"], "release"))
    by_batch: dict[int, list[str]] = {}
    for b, u in zip(rel["batch_id"].to_pylist(), rel["uid"].to_pylist()):
        by_batch.setdefault(b, []).append(u)
    return [sorted(us) for _, us in sorted(by_batch.items())]


def test_the_replay_releases_each_batch_once_where_the_recorded_run_released_it(
        tmp_path: Path) -> None:
    lake = _run(tmp_path / "lake", release_last=False)
    got = replay(lake, tmp_path / "replay")
    want = _released(lake)
    assert len(want) == 5                   # the last batch was never released
    assert _released(got.lake) == want
