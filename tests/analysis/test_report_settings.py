"""The report's configuration table says what a user set and what it does: a refill function as
"set", a rule without parameters as "on", an unset value as "not set", an old lake's CamelCase
refill name as today's; and the progress bar counts to one total from its first line."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from jobs.cli import app
from pipeline.analysis.report.settings import NOT_SET, rule_meaning, settings
from pipeline.config import async_config, sync_config
from pipeline.lake import config as lake_config
from tests.support.sql_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]


def my_refill(n: int) -> None:
    pass


def _rows(cfg: object) -> dict[str, tuple[str, str]]:
    return {s.name: (s.value, s.meaning) for s in settings(lake_config.describe(cfg))}


def test_a_refill_function_is_shown_as_set_not_by_its_python_name() -> None:
    rows = _rows(async_config(refill_fn=lambda n: None))
    assert rows["refill_fn"][0] == "set (a function)"
    assert rows["refill_fn"][1].startswith("called with n to dispatch n new prompts")
    assert _rows(async_config(refill_fn=my_refill))["refill_fn"][0] == \
        "set (the function my_refill)"
    assert _rows(async_config())["refill_fn"] == (NOT_SET, "evicted groups are not replaced")


def test_a_rule_without_parameters_is_on_and_says_what_it_evicts() -> None:
    rows = _rows(async_config(refill_fn=my_refill, filter_groups_metric="acc"))
    value, meaning = rows["rules.zero_variance"]
    assert value == "on"
    assert meaning == rule_meaning("zero_variance") and meaning.startswith("DAPO dynamic sampling")
    assert rows["filter_groups_metric"] == (
        "acc", "a finished group whose acc is the same for every trajectory is evicted")


def test_a_rule_with_parameters_shows_them_beside_on() -> None:
    rows = _rows(async_config(rules={"overlong": {"max_response_length": 512}}))
    assert rows["rules.overlong"][0] == "on (max_response_length = 512)"
    assert "mean response" in rows["rules.overlong"][1]


def test_an_unset_value_reads_not_set_with_what_applies_instead() -> None:
    rows = _rows(async_config(refill_fn=my_refill, filter_groups_metric="reward"))
    assert rows["refill.train_batch_size"] == (NOT_SET, "the call's batch size scales the cap")
    assert rows["refill.max_num_gen_batches"][0] == "0 (unbounded)"
    assert rows["refill"][0] == "replace_evicted"
    assert "refill.drains" not in rows                # follows from the policy; nobody sets it
    assert not any(v in ("{}", "–", "None", "null") for v, _ in rows.values())
    off = _rows(async_config(max_off_policy_threshold=None))
    assert off["max_off_policy_threshold"] == (NOT_SET, "no staleness bound")
    assert off["filter_groups_metric"] == (NOT_SET, "the zero-variance (DAPO) filter is off")


def test_the_sync_preset_says_its_threshold_is_not_used() -> None:
    rows = _rows(sync_config(max_off_policy_threshold=3))
    assert rows["preset"][0] == "sync"
    assert rows["max_off_policy_threshold"][1] == "not used: the sync preset trains on-policy"


def test_per_dataset_bounds_are_shown_each_with_the_default_for_the_rest() -> None:
    _, meaning = _rows(async_config(
        max_off_policy_threshold={"math": 2, "code": 8, "*": 4}))["max_off_policy_threshold"]
    assert meaning == ("a group may span at most its dataset's bound of trainer steps from "
                       "dispatch to training (code 8, math 2; any other 4)")


def test_an_old_lakes_camel_case_refill_policy_is_shown_by_todays_name() -> None:
    recorded = {"preset": "async", "rules": {}, "refill_fn": "run.<locals>.<lambda>",
                "refill": {"policy": "ReplaceEvicted", "max_num_gen_batches": 0,
                           "train_batch_size": None, "drains": False}}
    rows = {s.name: (s.value, s.meaning) for s in settings(recorded)}
    assert rows["refill"][0] == "replace_evicted"
    assert rows["refill"][1] == "every poll that evicts k groups asks refill_fn for k new prompts at once"
    assert rows["rules"] == ("none", "no eviction rule was on")
    assert rows["refill_fn"][0] == "set (a function)"


def test_a_key_this_version_does_not_know_is_shown_as_recorded() -> None:
    rows = {s.name: s.value for s in settings({"preset": "async", "new_knob": 7})}
    assert rows["new_knob"] == "7"


def test_the_pages_configuration_table_shows_meanings_not_python_names(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(shared_run("async").lake), "-o", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    table = re.search(r"<table class='config'>(.*?)</table>", out.read_text(), re.S)
    assert table is not None
    cells = [html.unescape(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", table.group(1))]
    assert cells[:3] == ["setting", "value", "what it does"]
    rows = {cells[i]: (cells[i + 1], cells[i + 2]) for i in range(3, len(cells), 3)}
    assert rows["refill_fn"][0].startswith("set (")
    assert "<locals>" not in table.group(1) and "&lt;locals&gt;" not in table.group(1)
    assert not any(v in ("{}", "–") for v, _ in rows.values()), rows
    assert all(m for name, (_, m) in rows.items() if name.startswith("rules.")), rows


def test_the_progress_bar_counts_to_one_total_from_the_start(tmp_path: Path) -> None:
    # the bar is drawn on a terminal only: stderr is a pseudo-terminal here, read as it comes
    import fcntl
    import os
    import pty
    import struct
    import termios
    import threading
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))   # 80 columns
    proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", "report",
                             str(shared_run("async").lake), "-o", str(tmp_path / "r.html")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:                    # the child closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    assert proc.wait(timeout=300) == 0
    reader.join(timeout=30)
    os.close(master)
    stderr = b"".join(chunks).decode(errors="replace")
    counts = [(int(a), int(b)) for a, b in re.findall(r"\b(\d+)/(\d+) \[", stderr)]
    assert counts, stderr
    totals = {b for _, b in counts}
    assert len(totals) == 1, counts                   # never 0/7 then 7/14
    assert counts[0][0] == 0 and counts[-1][0] == counts[-1][1]
