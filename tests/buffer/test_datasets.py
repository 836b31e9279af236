"""A group's `dataset`, on real buffers and real lakes: registered like `prompt_id` (null by
default), written to the lake, restored after a restart and shown by every view that shows the
prompt id; lakes written before the column open with it null."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline import ConfigError, IngestError, ReplayBuffer
from pipeline.analysis.views import connect, read_lake
from sql.loader import load, run
from tests.support.old_lake import without_columns


def _finish(buf: ReplayBuffer, uid: str, rewards: list[float], step: int = 0) -> None:
    buf.update_status(partition="train", uids=[uid], status="running")
    buf.put([{"partition": "train", "uid": uid, "session_id": s, "min_global_steps": step,
              "max_global_steps": step, "reward": r, "prompt_ids": [1], "response_ids": [2, 3]}
             for s, r in enumerate(rewards)])
    buf.update_status(partition="train", uids=[uid], status="finished")


def test_a_registered_dataset_is_in_the_live_view_and_survives_a_restart(tmp_path: Path) -> None:
    with ReplayBuffer.sync(lake=tmp_path / "lake") as buf:
        buf.register(partition="train", uids=["a", "b"], global_steps=0, dataset="math")
        buf.register(partition="train", uids=["c", "d"], global_steps=0, dataset=["code", None])
        buf.register({"partition": ["train"], "uid": ["e"], "global_steps": [0],
                      "dataset": ["gsm8k"]})
        assert [buf.lookup("train", u).dataset for u in "abcde"] == \
            ["math", "math", "code", None, "gsm8k"]
    with ReplayBuffer.sync(lake=tmp_path / "lake") as buf:
        assert [buf.lookup("train", u).dataset for u in "abcde"] == \
            ["math", "math", "code", None, "gsm8k"]
        assert buf.reissue(3) == {"train": ["a", "b", "c", "d", "e"]}
        assert buf.lookup("train", "c").dataset == "code"      # a re-issue keeps the dataset


def test_registration_without_a_dataset_leaves_it_null(tmp_path: Path) -> None:
    with ReplayBuffer.sync(lake=tmp_path / "lake") as buf:
        buf.register(partition="train", uids=["a"], global_steps=0, prompt_ids=[3])
        assert buf.lookup("train", "a").dataset is None
    ev = read_lake(tmp_path / "lake")["group_events"]
    assert ev.column("dataset").to_pylist() == [None]


@pytest.mark.parametrize(("dataset", "message"), [
    (["math"], "1 dataset names for 2 uids"),
    ([3, "code"], r"dataset\[0\]=3 must be a non-empty str"),
    (["math", ""], r"dataset\[1\]='' must be a non-empty str"),
    (7, "must be a name"),
])
def test_bad_dataset_names_are_refused_naming_the_position(dataset: object, message: str) -> None:
    buf = ReplayBuffer.sync()
    with pytest.raises(ConfigError, match=message):
        buf.register(partition="train", uids=["a", "b"], global_steps=0, dataset=dataset)
    assert buf.lookup("train", "a") is None


def test_an_empty_dataset_in_rows_is_an_ingest_error_naming_the_row() -> None:
    buf = ReplayBuffer.sync()
    with pytest.raises(IngestError, match=r"dataset.*\[1\]|rows? \[?1"):
        buf.register([{"partition": "train", "uid": "a", "global_steps": 0, "dataset": "math"},
                      {"partition": "train", "uid": "b", "global_steps": 0, "dataset": ""}])
    assert buf.lookup("train", "a") is None


def test_dataset_with_rows_is_refused() -> None:
    buf = ReplayBuffer.sync()
    with pytest.raises(ConfigError, match="give each row a `prompt_id` / `dataset`"):
        buf.register({"partition": ["train"], "uid": ["a"], "global_steps": [0]}, dataset="x")


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """One trained math group, one live code group, one in-flight group without a dataset."""
    lake = tmp_path / "lake"
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=4) as buf:
        buf.register(partition="train", uids=["m"], global_steps=0, dataset="math",
                     prompt_ids=[1])
        buf.register(partition="train", uids=["c"], global_steps=0, dataset="code")
        buf.register(partition="train", uids=["x"], global_steps=0)
        _finish(buf, "m", [0.0, 1.0])
        batch = buf.sample(global_steps=1, partition_id="train", batch_size=1)
        buf.release(batch)
        _finish(buf, "c", [1.0])
    return lake


def test_every_view_that_shows_the_prompt_id_shows_the_dataset(lake: Path) -> None:
    con = connect(lake)
    want = {"m": "math", "c": "code", "x": None}
    for view, uids in (("groups", "mcx"), ("trajectory_fates", "mc"), ("batch_rows", "m"),
                       ("inflight", "x")):
        got = dict(con.sql(f"select distinct uid, dataset from {view}").fetchall())
        assert got == {u: want[u] for u in uids}, view
    lineage = run(con, load("lineage"), uid="m").to_pylist()
    assert lineage[0]["detail"] == "global_steps=0, prompt_id=1, dataset=math"


def test_a_lake_written_before_the_dataset_column_opens_with_it_null(
        tmp_path: Path, lake: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(lake, old)
    assert without_columns(old, {"group_events": ["dataset"]}) >= 1
    events = read_lake(old)["group_events"]
    assert events.column("dataset").null_count == events.num_rows == 7
    assert connect(old).sql("select count(*) from groups where dataset is null").fetchall() \
        == [(3,)]
    with ReplayBuffer.async_(lake=old, max_off_policy_threshold=4) as buf:
        assert buf.lookup("train", "c").dataset is None
        buf.register(partition="train", uids=["late"], global_steps=1, dataset="math")
    assert connect(old).sql(
        "select dataset from groups where uid = 'late'").fetchall() == [("math",)]
