"""`replaylake whatif --compare`: every figure of the printed table (and its Parquet) against
independent SQL over each run's own lake (the recorded one, and each replay's), the KS statistic
against a numpy computation, dataset shares and starvation against a Python count, the recorded
setting reproducing every batch, and bad items refused before any replay runs."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis import connect
from sql import loader
from tests.support.sql_runs import shared_run

POLICIES = ["strategy=drop", "threshold=1", "threshold=4", "strategy=wait", "strategy=admit",
            "strategy=mask"]


def tables(output: str) -> dict[str, dict[str, str]]:
    """The printed tables read back: policy -> header -> cell (the dataset table left out).
    Figures are right-aligned, so a header's words end where the column's cells end."""
    lines = output.splitlines()
    out: dict[str, dict[str, str]] = {}
    for i, line in enumerate(lines):
        if not line.startswith("policy ") or lines[i - 2].startswith("datasets"):
            continue
        if any(x.startswith("datasets") for x in lines[i - 4:i - 1]):
            continue
        body = []
        for row in lines[i + 1:]:
            if not row.strip():
                break
            body.append(row)
        label_end = max(len(r.split()[0]) for r in body)
        ends = sorted({m.end() for r in body for m in re.finditer(r"\S+", r)} - {
            len(r.split()[0]) for r in body})
        ends = [e for e in ends if e > label_end]
        head = {e: " ".join(h[s:e].strip() for h in (lines[i - 1], line) if h[s:e].strip())
                for s, e in zip([label_end, *ends], ends)}
        for row in body:
            cells = {m.end(): m.group() for m in re.finditer(r"\S+", row)}
            out.setdefault(row.split()[0], {}).update(
                {head[end]: v for end, v in cells.items() if end in head})
    return out


def independent(lake: Path, admit: bool) -> dict[str, Any]:
    """Every figure of one row from the lake's base tables (decisions, trajectories) alone."""
    con = connect(lake)
    con.execute(f"""
        create temp table sel as
            select distinct partition, uid, step from decisions where kind = 'select';
        create temp table saved as
            select distinct partition, uid from decisions
            where {str(admit).lower()} and kind = 'evict' and reason = 'stale';
        create temp table gone as
            select distinct partition, uid from decisions where kind in ('evict', 'discard');
        create temp table t as
            select tr.partition, tr.uid, tr.reward, tr.n_response_tokens as n_tokens,
                   tr.max_global_steps, tr.version_spans, s.step,
                   s.uid is not null as trained, sv.uid is not null as saved,
                   g.uid is not null and s.uid is null as gone
            from trajectories as tr
            left join sel as s on s.partition = tr.partition and s.uid = tr.uid
            left join saved as sv on sv.partition = tr.partition and sv.uid = tr.uid
            left join gone as g on g.partition = tr.partition and g.uid = tr.uid
            where not tr.is_padding""")

    def one(sql: str) -> Any:
        return con.sql(sql).fetchall()[0][0]
    f: dict[str, Any] = {
        "batches": one("select count(distinct (partition, batch_id)) from decisions "
                       "where kind = 'select'"),
        "groups": one("select count(*) from (select distinct partition, uid from sel)"),
        "trajs": one("select count(*) from t where trained"),
        "wasted trajs": one("select count(*) from t where gone and not saved"),
        "wasted tokens": one("select coalesce(sum(n_tokens), 0) from t where gone and not saved"),
        "saved trajs": one("select count(*) from t where saved"),
        "saved tokens": one("select coalesce(sum(n_tokens), 0) from t where saved"),
        "left at end": one("select count(*) from t where not trained and not gone"),
        "over bound": loader.run(con, "certificate_holds").num_rows,   # the audit itself
    }
    for reason, n in con.sql("""
            select reason, count(distinct (partition, uid)) from decisions
            where kind = 'evict' and (partition, uid) not in (select (partition, uid) from saved)
            group by reason""").fetchall():
        f[f"evicted {reason}"] = n
    stale = "(step - 1) - max_global_steps"
    future, mean, top, fmean, ftop = con.sql(
        f"select count(*) filter (where {stale} < 0), avg({stale}), max({stale}), "
        f"avg(greatest({stale}, 0)), max(greatest({stale}, 0)) from t where trained"
        ).fetchall()[0]
    tok, tok_floor = con.sql(f"""
        select sum(((step - 1) - sp.version) * sp.n_tokens) / sum(sp.n_tokens),
               sum(case when {stale} < 0 then 0 else ((step - 1) - sp.version) * sp.n_tokens
                   end) / sum(sp.n_tokens)
        from (select *, unnest(version_spans) as sp from t where trained)""").fetchall()[0]
    floor = ">=" if future else ""
    f["future rows"] = future
    f["stale mean"] = floor + f"{fmean if future else mean:.3f}"
    f["stale max"] = floor + str(ftop if future else top)
    f["token exact"] = floor + f"{float(tok_floor if future else tok):.3f}"
    arrays = {c: con.sql(f"select {c}::double as {c}, trained from t where not saved")
              .fetchnumpy() for c in ("n_tokens", "reward")}
    for col, key in (("n_tokens", "KS length"), ("reward", "KS reward")):
        a = arrays[col]
        f[key] = ks(a[col][a["trained"]], a[col])
    f["_batches"] = [r[0] for r in con.sql(
        "select list(uid order by seq) from decisions where kind = 'select' and call_id >= 0 "
        "group by call_id order by call_id").fetchall()]
    return f


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical
    distribution functions, evaluated at every observed value."""
    x = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), x, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), x, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def _text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def test_ks_matches_a_hand_count() -> None:
    # F_a - F_b at 1: 2/3 - 1/4, at 2: 1 - 2/4 = 0.5 (the largest), at 3 and 4: 0 and 0
    assert ks(np.array([1.0, 1, 2]), np.array([1.0, 2, 3, 4])) == pytest.approx(0.5)
    assert ks(np.array([1.0, 2]), np.array([2.0, 1])) == 0.0


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    lake = shared_run("async").lake
    out = tmp_path_factory.mktemp("compare")
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--compare", *POLICIES,
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    return lake, out, res.output


def test_every_printed_figure_matches_independent_sql_over_each_runs_lake(
        compared: tuple[Path, Path, str]) -> None:
    lake, out, output = compared
    printed = tables(output)
    assert list(printed) == ["recorded", *POLICIES]
    recorded = independent(lake, admit=False)
    # the recorded lake holds its tokens, each replay's lake their counts alone (what a replay
    # puts): the lengths the figures count are the recorded run's either way
    assert connect(lake).sql("select count(*) from trajectories "
                             "where len(response_ids) <> n_response_tokens").fetchall() == [(0,)]
    lakes = [lake] + [out / "replays" / f"p{i}" / "lake" for i in range(1, len(POLICIES) + 1)]
    for label, row_lake in zip(printed, lakes):
        want = independent(row_lake, admit=label == "strategy=admit")
        got = printed[label]
        for key, value in want.items():
            if key.startswith("_"):
                continue
            assert got.get(key, "0" if key.startswith("evicted") else None) == _text(value), \
                (label, key)
        # a reason the text shows is one the lake has (others print 0)
        assert all(want.get(k, 0) == int(v) for k, v in got.items() if k.startswith("evicted"))
        same = sum(a == b for a, b in zip(recorded["_batches"], want["_batches"]))
        assert got["same batches"] == str(same), label
    table = output.split("\nwrote:\n")[0]           # then the paths written, one a line
    assert max(len(line) for line in table.splitlines()) <= 80


def test_the_comparison_shows_what_each_policy_changes(compared: tuple[Path, Path, str]) -> None:
    _, _, output = compared
    t = tables(output)
    calls = t["recorded"]["batches"]
    # the recorded setting reproduces every batch, so it needs no approximation
    assert t["strategy=drop"]["same batches"] == calls == t["recorded"]["same batches"]
    assert "  strategy=drop:" not in output
    assert int(t["threshold=1"]["evicted stale"]) > int(t["recorded"]["evicted stale"])
    assert t["strategy=mask"]["evicted stale"] == "0" and int(t["strategy=mask"]["over bound"]) > 0
    # admit = drop with its stale groups never dispatched: saved, not wasted, same trained rows
    admit, rec = t["strategy=admit"], t["recorded"]
    assert admit["trajs"] == rec["trajs"] and int(admit["saved trajs"]) > 0
    assert int(admit["wasted trajs"]) + int(admit["saved trajs"]) == int(rec["wasted trajs"])
    notes = output.split("what the replay approximates, per policy:")[1]
    assert "  strategy=admit:\n    - admit: replayed as drop at the same bound" in notes


def test_the_parquet_table_holds_the_printed_rows(compared: tuple[Path, Path, str]) -> None:
    _, out, output = compared
    table = pq.read_table(out / "compare.parquet").to_pylist()
    printed = tables(output)
    assert [r["policy"] for r in table] == list(printed)
    for r in table:
        p = printed[r["policy"]]
        assert (str(r["trained_trajectories"]), str(r["wasted_tokens"]), str(r["saved_tokens"]),
                str(r["evicted_stale"]), f"{r['ks_response_len']:.3f}") == \
            (p["trajs"], p["wasted tokens"], p["saved tokens"], p["evicted stale"],
             p["KS length"])
        assert r["trained_rows"] == r["trained_trajectories"]
    assert table[0]["notes"] == [] and any("admit:" in n for n in table[5]["notes"])
    page = (out / "whatif.html").read_text()
    assert page.count("<img ") == 3        # no dataset figure: the run names no dataset
    assert all(f"</span> {i}: {p}</th>" in page for i, p in enumerate(POLICIES, 1))
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert page.count("<table") == page.count("<div class='scroll'><table")   # scroll sideways


def test_a_window_compares_every_policy_over_the_same_first_calls(tmp_path: Path) -> None:
    from pipeline.analysis.whatif import recorded
    lake = shared_run("async").lake
    calls = len(recorded(lake).batches)
    k = calls // 2
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--compare", "--calls", str(k),
                                   "strategy=drop", "threshold=1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert f"x {k} sample calls" in res.output
    printed = tables(res.output)
    assert list(printed) == ["recorded", "strategy=drop", "threshold=1"]
    # the recorded row is the recorded settings replayed over the window: the first k batches
    rows = [tmp_path / "replays" / f"p{i}" / "lake" for i in range(3)]
    assert recorded(rows[0]).batches == recorded(lake).batches[:k]
    assert printed["recorded"]["same batches"] == printed["strategy=drop"]["same batches"] == str(k)
    # every policy is fed the rows the recorded run had written by the end of its k-th call
    con = connect(lake)
    end = con.sql(f"""select max(seq) from decisions where call_id = (
        select call_id from (select distinct call_id from decisions where call_id >= 0
                             and kind = 'select' order by call_id limit {k}) order by call_id
        desc limit 1)""").fetchall()[0][0]
    fed = con.sql(f"select count(*) from trajectories where seq <= {end}").fetchall()[0][0]
    every = con.sql("select count(*) from trajectories").fetchall()[0][0]
    assert 0 < fed < every
    for row_lake in rows:
        n = connect(row_lake).sql("select count(*) from trajectories").fetchall()[0][0]
        assert n == fed, row_lake
    for label, row_lake in zip(printed, rows):
        want = independent(row_lake, admit=False)
        assert printed[label]["trajs"] == _text(want["trajs"]), label
        assert printed[label]["wasted trajs"] == _text(want["wasted trajs"]), label


# --- datasets ------------------------------------------------------------------------------

def _datasets_run(lake: Path, steps: int = 8) -> Path:
    """math groups finish at once (2 tokens), code groups two steps later (6 tokens), so a
    bound tighter than the recorded 4 evicts code as stale and starves it."""
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=4, filter_groups_metric=None,
                             poll_interval=0.001) as buf:
        for g in range(1, steps + 1):
            for uid, ds, tokens in ((f"m{g}a", "math", 2), (f"m{g}b", "math", 2),
                                    (f"c{g}", "code", 6)):
                buf.register(partition="train", uids=[uid], global_steps=g - 1, n=2, dataset=ds)
                buf.put([{"partition": "train", "uid": uid, "session_id": s, "index": 0,
                          "min_global_steps": g - 1, "max_global_steps": g - 1,
                          "reward": float(s) if ds == "math" else 0.5, "prompt_ids": [1],
                          "response_ids": list(range(tokens)), "is_padding": False}
                         for s in range(2)])
                if ds == "math":
                    buf.update_status(partition="train", uids=[uid], status="finished")
            if g > 2:
                buf.update_status(partition="train", uids=[f"c{g - 2}"], status="finished")
            buf.release(buf.sample(g, "train", 2 if g <= 2 else 3, timeout=10))
    return lake


def starvation(lake: Path) -> dict[str, tuple[int, int]]:
    """dataset -> (stretches, longest), counted in Python from the base tables: at each step's
    first selection, a dataset with a group registered and not yet ended but nothing trained."""
    con = connect(lake)
    events = con.sql("select uid, event, dataset, seq from group_events order by seq").fetchall()
    decisions = con.sql("select uid, kind, step, batch_id, seq from decisions "
                        "order by seq").fetchall()
    dataset = {u: d for u, e, d, _ in events if e == "registered"}
    firsts: dict[int, tuple[int, int]] = {}
    for _, kind, step, batch, seq in decisions:
        if kind == "select" and step not in firsts:
            firsts[step] = (batch, seq)
    runs: dict[str, list[int]] = {}
    for k, (batch, seq) in enumerate(v for _, v in sorted(firsts.items())):
        reg = {u for u, e, _, s in events if e == "registered" and s < seq}
        ended = {u for u, e, _, s in events if e in ("finished", "failure") and s < seq}
        ended |= {u for u, kind, _, _, s in decisions if kind in ("evict", "discard") and s < seq}
        trained = {dataset[u] for u, kind, _, b, _ in decisions if kind == "select" and b == batch}
        for ds in {dataset[u] for u in reg - ended} - trained:
            runs.setdefault(ds, []).append(k)
    out = {}
    for ds, ks_ in runs.items():
        stretches = np.split(np.array(ks_), np.where(np.diff(ks_) != 1)[0] + 1)
        out[ds] = (len(stretches), max(len(s) for s in stretches))
    return out


def test_dataset_shares_and_starvation_match_a_count_of_each_runs_lake(tmp_path: Path) -> None:
    lake = _datasets_run(tmp_path / "recorded")
    out = tmp_path / "cmp"
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--compare", "threshold=2",
                                   "strategy=admit,threshold=2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out / "datasets.parquet").to_pylist()
    lakes = {"recorded": lake, "threshold=2": out / "replays" / "p1" / "lake",
             "strategy=admit,threshold=2": out / "replays" / "p2" / "lake"}
    assert {r["policy"] for r in rows} == set(lakes)
    for label, row_lake in lakes.items():
        con = connect(row_lake)
        saved = label.startswith("strategy=admit")
        counts = dict(con.sql(f"""
            select g.dataset, count(*) filter (where s.uid is not null)
            from trajectories as t
            join (select uid, dataset from group_events where event = 'registered') as g
                on g.uid = t.uid
            left join (select distinct uid from decisions where kind = 'select') as s
                on s.uid = t.uid
            where not t.is_padding and not ({str(saved).lower()} and t.uid in (
                select uid from decisions where kind = 'evict' and reason = 'stale'))
            group by g.dataset""").fetchall())
        total = sum(counts.values())
        starved = starvation(row_lake)
        for r in (r for r in rows if r["policy"] == label):
            ds = r["dataset"]
            assert r["trained_trajectories"] == counts[ds]
            assert r["trained_share"] == pytest.approx(counts[ds] / total)
            assert (r["starved_stretches"], r["longest_starved"]) == starved.get(ds, (0, 0))
    by = {(r["policy"], r["dataset"]): r for r in rows}
    # the tighter bound evicts code as stale: it trains less of it and starves it longer
    assert by[("threshold=2", "code")]["trained_share"] < by[("recorded", "code")]["trained_share"]
    assert by[("threshold=2", "code")]["longest_starved"] > \
        by[("recorded", "code")]["longest_starved"]
    # admit never generated what drop evicted as stale: code's generated share drops too
    assert by[("strategy=admit,threshold=2", "code")]["generated_share"] < \
        by[("threshold=2", "code")]["generated_share"]
    assert "datasets: share of the trained" in res.output
    assert (out / "whatif.html").read_text().count("<img ") == 4


# --- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize(("item", "message"), [
    ("thresh=1", "'thresh' is no setting a replay takes; did you mean 'threshold'?"),
    ("threshold=x", "--compare 'threshold=x': Invalid max off policy threshold"),
    ("strategy=bogus", "--compare 'strategy=bogus': Invalid max off policy strategy"),
    ("threshold", "write each setting as KEY=VALUE"),
    ("rule=overlong.max_respons=3", "did you mean 'max_response_length'"),
    ("poll_interval=1", "'poll_interval' is no setting a replay takes"),
    ("threshold=1,threshold=2", "'threshold' is given twice"),
])
def test_a_bad_item_is_refused_before_any_replay_runs(tmp_path: Path, item: str,
                                                      message: str) -> None:
    res = CliRunner().invoke(app, ["whatif", "--lake", str(shared_run("async").lake),
                                   "--compare", "threshold=1", item, "--out", str(tmp_path)])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert not (tmp_path / "replays").exists()


def test_compare_items_and_single_options_do_not_mix(tmp_path: Path) -> None:
    lake = str(shared_run("async").lake)
    for args, message in ((["threshold=1"], "without --compare"),
                          (["--compare"], "needs at least one POLICY"),
                          (["--compare", "threshold=1", "--threshold", "2"],
                           "not --threshold"),
                          (["--compare", "threshold=1", "--selection-order", "spread_first"],
                           "not --selection-order"),
                          (["--calls", "2"], "--calls windows a --compare"),
                          (["--compare", "--calls", "0", "threshold=1"], "--calls 0: give")):
        res = CliRunner().invoke(app, ["whatif", "--lake", lake, *args])
        assert res.exit_code == 2 and message in res.output, res.output


def test_items_take_json_values_mappings_and_none() -> None:
    from pipeline.analysis.whatif.compare import parse_policy
    keys = ["max_off_policy_threshold", "max_off_policy_strategy", "filter_groups_metric",
            "rules", "selection_order"]
    p = parse_policy('threshold={"math": 2, "*": 8},filter_metric=none,'
                     'rules={"overlong": null},selection_order=spread_first', keys)
    assert p.settings == {"max_off_policy_threshold": {"math": 2, "*": 8},
                          "filter_groups_metric": None, "rules": {"overlong": None},
                          "selection_order": "spread_first"}
    assert parse_policy("rule=overlong=off,rule=short_response.min_response_length=2",
                        keys).settings == {"rules": {"overlong": None, "short_response":
                                                     {"min_response_length": 2}}}


def test_the_notes_name_the_steps_a_policy_left_unfilled(tmp_path: Path) -> None:
    from tests.analysis.test_whatif import _pipelined_run
    lake = _pipelined_run(tmp_path / "recorded")             # 8 calls at steps 1-8
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lake), "--compare", "threshold=1",
                                   "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output

    def steps(row_lake: Path) -> set[int]:
        return {s for (s,) in connect(row_lake).sql(
            "select distinct step from decisions where kind = 'select'").fetchall()}
    missing = sorted(steps(lake) - steps(tmp_path / "cmp" / "replays" / "p1" / "lake"))
    assert missing == [7, 8]
    assert tables(res.output)["threshold=1"]["batches"] == "6"
    notes = " ".join(res.output.split("  threshold=1:")[1].split())
    assert "- unfilled: 2 of 8 sample calls (steps 7-8) handed out no batch" in notes
