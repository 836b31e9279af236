"""docs/verl.md, the contract of a rollout side that is not verl's agent loop: its example runs
as written against the real TransferQueue and prints what its comments say, and the rules it
states hold (a status update keeps the prompt key's tags; a uid with `_` is refused)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.adapters.verl import ReplayBufferAsync
from pipeline.errors import IngestError

pytestmark = pytest.mark.verl

DOC = Path(__file__).resolve().parents[3] / "docs" / "verl.md"


def _example() -> str:
    block = re.search(r"## A runnable example\n.*?```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, "docs/verl.md lost its runnable example"
    return block.group(1)


def test_the_pages_example_runs_as_written_and_prints_what_its_comments_say(
        tq, rollout, capsys) -> None:
    code = _example()
    exec(compile(code, "docs/verl.md", "exec"), {})   # noqa: S102 - our own page, as a user runs it
    printed = capsys.readouterr().out.splitlines()
    promised = re.findall(r"^print\(.*\)\s+# (.*?): ", code, re.M)
    assert len(promised) == 3 and printed == promised, (printed, promised)
    assert rollout.listing() == {}        # the trainer cleared the batch; the eviction the rest


def test_a_status_update_keeps_the_prompt_keys_other_tags(tq, rollout) -> None:
    tq.kv_put("g1", "train", tag={"is_prompt": True, "global_steps": 3, "status": "running"})
    tq.kv_put("g1", "train", tag={"status": "finished"})
    assert rollout.listing()["g1"] == {"is_prompt": True, "global_steps": 3, "status": "finished"}


def test_a_prompt_key_with_an_underscore_is_refused_naming_it(tq, rollout) -> None:
    tq.kv_put("g_1", "train", tag={"is_prompt": True, "global_steps": 1, "status": "running"})
    buf = ReplayBufferAsync("colocate_async", {}, 4, "drop", {}, poll_interval=0.05)
    try:
        with pytest.raises(IngestError, match="'g_1' contains '_'"):
            buf.get_sampleable_count(1, "train")
    finally:
        buf.close()
