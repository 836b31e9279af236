"""The `prompt_history` view over a real lake whose history is worked out by hand (the scripted
run of tests/support/prompt_runs.py), and the two documented queries answering "which prompts
waste the most generation" and "which prompts are solved" on it."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pipeline.analysis.views import connect
from tests.support.prompt_runs import prompt_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prompt_run(tmp_path_factory.mktemp("prompts") / "lake")


def _history(lake: Path) -> dict[int, dict]:
    rows = connect(lake).sql("select * from prompt_history").to_arrow_table().to_pylist()
    assert [r["partition"] for r in rows] == ["train"] * 4
    return {r["prompt_id"]: r for r in rows}


def test_attempts_and_fates_per_prompt(lake: Path) -> None:
    h = _history(lake)
    assert sorted(h) == [1, 2, 3, 4]             # u8 has no prompt id
    got = {p: (r["n_groups"], r["dispatches"], r["first_dispatch_step"],
               r["last_dispatch_step"], r["trained"], r["evicted"], dict(r["evicted_by_reason"]),
               r["discarded"], r["live"], r["last_trained_step"]) for p, r in h.items()}
    assert got == {
        1: (3, 3, 1, 3, 0, 3, {"zero_variance": 3}, 0, 0, None),
        2: (2, 3, 1, 3, 2, 0, {}, 0, 0, 3),      # u5 dispatched at 2, re-issued at 3
        3: (1, 1, 1, 1, 0, 1, {"failure": 1}, 0, 0, None),
        4: (1, 1, 1, 1, 0, 1, {"stale": 1}, 0, 0, None),
    }


def test_pass_rate_and_zero_variance_share(lake: Path) -> None:
    h = _history(lake)
    got = {p: (r["n_responses"], r["reward_mean"], r["reward_min"], r["reward_max"], r["solved"],
               r["scored_groups"], r["zero_variance_groups"], r["zero_variance_share"])
           for p, r in h.items()}
    assert got == {
        1: (6, 1.0, 1.0, 1.0, True, 3, 3, 1.0),
        # the dropped partial response (reward 1) is not a completed response
        2: (4, 0.5, 0.0, 1.0, False, 2, 0, 0.0),
        3: (0, None, None, None, False, 0, 0, None),
        4: (2, 0.5, 0.0, 1.0, False, 1, 0, 0.0),
    }


def test_response_lengths_per_dispatch_step(lake: Path) -> None:
    h = _history(lake)
    assert (h[1]["response_len_mean"], h[1]["response_len_max"]) == (pytest.approx(14 / 6), 4)
    assert h[1]["response_len_by_step"] == [
        {"step": 1, "n_responses": 4, "len_mean": 3.0, "len_max": 4},
        {"step": 3, "n_responses": 2, "len_mean": 1.0, "len_max": 1}]
    # u5's 7-token partial response was dropped: its new responses count at its new step
    assert (h[2]["response_len_mean"], h[2]["response_len_max"]) == (2.5, 5)
    assert h[2]["response_len_by_step"] == [
        {"step": 1, "n_responses": 2, "len_mean": 3.0, "len_max": 5},
        {"step": 3, "n_responses": 2, "len_mean": 2.0, "len_max": 2}]
    assert h[3]["response_len_by_step"] == [] and h[3]["response_len_max"] is None
    assert h[4]["response_len_by_step"] == [
        {"step": 1, "n_responses": 2, "len_mean": 6.0, "len_max": 6}]


def test_generation_spent_and_wasted(lake: Path) -> None:
    h = _history(lake)
    got = {p: (r["tokens_generated"], r["tokens_trained"], r["tokens_wasted"])
           for p, r in h.items()}
    assert got == {1: (14, 0, 14), 2: (17, 10, 7), 3: (0, 0, 0), 4: (12, 0, 12)}
    assert [h[p]["wasted_share"] for p in (1, 2, 3, 4)] == [1.0, 7 / 17, None, 1.0]
    # every token the lake holds is some prompt's, but for the 6 of u8 (no prompt id)
    total = connect(lake).sql("select sum(n_response_tokens) from trajectories "
                              "where not is_padding").fetchall()[0][0]
    assert total == sum(r["tokens_generated"] for r in h.values()) + 6


def _documented(question: str) -> str:
    """The SQL of the prompts doc's command under the comment ``# question``."""
    lines = (ROOT / "docs" / "prompts.md").read_text().splitlines()
    command = lines[lines.index(f"# {question}") + 1]
    return shlex.split(command)[-1]


def test_the_documented_queries_answer_both_questions_in_one_query_each(lake: Path) -> None:
    con = connect(lake)
    wasteful = con.sql(_documented("which prompts waste the most generation")).fetchall()
    assert [(r[0], r[1], r[2]) for r in wasteful] == [(1, 14, 14), (4, 12, 12), (2, 7, 17),
                                                     (3, 0, 0)]
    solved = con.sql(_documented(
        "which prompts are solved (and how much generation they still take)")).fetchall()
    assert solved == [(1, 6, 14, 0, None)]
