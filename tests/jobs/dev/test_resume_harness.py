"""The resume harness, small: the demo killed by SIGKILL at five positions, resumed with sibling
reuse, and every figure the harness reads from the lake held to a count made here from the raw
lake tables (and to what the resumed run said it handed back)."""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest
from typer.testing import CliRunner

from jobs.dev.resume_harness import (
    DEFAULT_POSITIONS,
    Killer,
    run_harness,
    small_demo,
    table,
)
from pipeline.lake import read_table

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def raw_counts(lake) -> dict:
    """What a restart cost, counted from the lake's tables row by row."""
    events = read_table(lake, "group_events").to_pylist()
    trajs = [t for t in read_table(lake, "trajectories").to_pylist() if not t["is_padding"]]
    decisions = read_table(lake, "decisions").to_pylist()
    reissues = [e for e in events if e["event"] == "reissued"]
    by_group = defaultdict(list)
    for t in trajs:
        by_group[t["uid"]].append(t)
    at_restart, kept, copies = [], [], set()
    for r in reissues:
        before = [t for t in by_group[r["uid"]] if t["seq"] < r["seq"]]
        after = [t for t in by_group[r["uid"]] if t["seq"] > r["seq"]]
        at_restart += before
        # a kept sibling is written again after the event, the same trajectory
        same = {(t["session_id"], t["index"], tuple(t["response_ids"]), t["reward"])
                for t in after}
        for t in before:
            if (t["session_id"], t["index"], tuple(t["response_ids"]), t["reward"]) in same:
                kept.append(t)
        copies |= {t["seq"] for t in after[:len([t for t in before if t in kept])]}
    first = min((r["seq"] for r in reissues), default=None)
    fated = {d["uid"] for d in decisions if d["kind"] in ("select", "evict", "discard")}
    registered = {e["uid"]: e["seq"] for e in events if e["event"] == "registered"}
    skipped = [u for u, s in registered.items() if first is not None and s < first
               and u not in fated]
    selects = Counter(d["uid"] for d in decisions if d["kind"] == "select")
    interrupted = {r["uid"] for r in reissues}
    generated = [t for t in trajs if t["seq"] not in copies]
    redone = [t for t in generated if t["uid"] in interrupted
              and any(r["uid"] == t["uid"] and r["seq"] < t["seq"] for r in reissues)]
    return {
        "interrupted_groups": len(interrupted),
        "sessions_at_restart": len(at_restart),
        "sessions_kept": len(kept),
        "trajectories_lost": len(at_restart) - len(kept),
        "prompts_skipped": len(skipped),
        "trajectories_trained_twice": sum(len(by_group[u]) for u, k in selects.items() if k > 1),
        "tokens_saved": sum(len(t["response_ids"]) for t in kept),
        "seconds_saved": sum(t["generation_s"] for t in kept),
        "redone_lengths": [len(t["response_ids"]) for t in redone],
        "all_lengths": [len(t["response_ids"]) for t in generated],
    }


def test_five_kills_resumed_with_reuse_lose_skip_and_repeat_nothing(tmp_path):
    cfg = small_demo(steps=4)
    seen = []
    outcomes = run_harness(list(DEFAULT_POSITIONS), cfg, 1, tmp_path,
                           progress=lambda i, o: seen.append((i, o.position)), audits=False)
    assert seen == list(enumerate(DEFAULT_POSITIONS, 1))
    for o in outcomes:
        f, raw = o.figures, raw_counts(tmp_path / o.position / "lake")
        where = f"killed at {o.position}: {f}"
        for key in ("interrupted_groups", "sessions_at_restart", "sessions_kept",
                    "trajectories_lost", "prompts_skipped", "trajectories_trained_twice",
                    "tokens_saved"):
            assert f[key] == raw[key], f"{key} {where}"
        assert f["seconds_saved"] == pytest.approx(raw["seconds_saved"]) \
            if raw["sessions_kept"] else f["seconds_saved"] is None
        # what the resumed run handed back is what the lake says it kept
        assert (f["interrupted_groups"], f["sessions_kept"]) == \
            (o.handed_back["groups"], o.handed_back["kept"]), where
        assert (f["trajectories_lost"], f["prompts_skipped"],
                f["trajectories_trained_twice"]) == (0, 0, 0), where
        if f["sessions_at_restart"]:
            assert f["reused_share"] == 1.0, where
        assert f["seconds_saved"] is None or f["seconds_saved"] > 0
        all_len, redone = o.lengths["all"], o.lengths.get("re-dispatched")
        assert (all_len["n"], all_len["len_max"]) == \
            (len(raw["all_lengths"]), max(raw["all_lengths"]))
        assert all_len["len_mean"] == pytest.approx(np.mean(raw["all_lengths"]))
        assert (redone["n"] if redone else 0) == len(raw["redone_lengths"]), where
    # killed half way through generating, a group's first wave is always kept
    gen = next(o for o in outcomes if o.position == "generation").figures
    assert gen["sessions_kept"] > 0 and gen["tokens_saved"] >= gen["sessions_kept"]
    lines = table(outcomes)
    assert max(len(line) for line in lines) <= 80
    assert lines[1].split()[:2] == ["killed", "at"]
    assert [line.split()[0] for line in lines if line.startswith("total")] == ["total"]


def test_the_killer_arms_only_once_its_step_is_done(tmp_path):
    k = Killer("generation", 3, tmp_path)
    k("step", 2)
    k("wave", None)
    k("token", None)                     # not armed yet: no kill, no wave counted
    assert not k.armed and not k.between


def test_the_command_refuses_unknown_positions_and_a_kill_after_the_last_step():
    from jobs.cli import app
    runner = CliRunner()
    r = runner.invoke(app, ["dev", "resume-harness", "--positions", "nowhere"])
    assert r.exit_code == 2 and "nowhere" in r.output
    r = runner.invoke(app, ["dev", "resume-harness", "--steps", "3", "--at", "3"])
    assert r.exit_code == 2 and "--at 3" in r.output
