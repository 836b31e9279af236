"""The numpy engine of the declarations (`pipeline.decide.vectors`) against DuckDB, which runs
the same SQL over the lake: row expressions and aggregates over frames with NULLs, values past 64
bits, and the constructs it refuses."""
from __future__ import annotations

import random

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from pipeline.decide import vectors
from sql.loader import SqlError

ROW_EXPRESSIONS = [
    "a + b", "a - b * 2", "-a", "abs(a - 5)", "a / b", "a::hugeint * b - c",
    "a > b", "a >= 3", "a = b", "a <> b", "a < b and p", "a < b or p", "not p", "p and q",
    "p or q", "a is null", "b is not null", "nullif(a, 0)", "coalesce(a, b, 7)",
    "case when a > 2 then b end", "case when p then a when q then b else c end",
    "case when a > 0 then 1.5 else b end", "(c - 1) - a", "c::double / 4",
    "greatest(a, b)", "least(a, b, 3)", "greatest(a - 9, c::double / 4)", "greatest(a, null)",
]
AGGREGATES = [
    "count(*)", "count(a)", "sum(a)", "avg(a)", "min(a)", "max(b)", "avg(c)",
    "sum(a::hugeint * b) / nullif(sum(b), 0)", "max(case when b > 0 then a end)",
    "cast(sum(b) as bigint)", "sum(c) / nullif(count(a), 0)", "min(p)", "max(a - b)",
]
SEEDS = range(12)


def _frame(seed: int, n: int) -> pa.Table:
    rng = random.Random(seed)

    def ints(null_share: float, low: int, high: int) -> list:
        return [None if rng.random() < null_share else rng.randint(low, high) for _ in range(n)]

    def bools() -> list:
        return [None if rng.random() < 0.2 else rng.random() < 0.5 for _ in range(n)]
    share = rng.choice([0.0, 0.3, 1.0])
    return pa.table({"a": pa.array(ints(share, -6, 6), pa.int64()),
                     "b": pa.array(ints(0.2, 0, 4), pa.int64()),
                     "c": pa.array(ints(0.0, -9, 9), pa.int64()),
                     "p": pa.array(bools(), pa.bool_()), "q": pa.array(bools(), pa.bool_())})


def _env(t: pa.Table) -> dict[str, vectors.Col]:
    return {c: vectors.column(t.column(c)) for c in t.column_names}


def _close(ours, theirs) -> bool:
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if isinstance(theirs, float) or isinstance(ours, float):
        return ours == pytest.approx(float(theirs), rel=1e-12, abs=1e-12, nan_ok=True)
    return ours == theirs


@pytest.mark.parametrize("seed", SEEDS)
def test_row_expressions_agree_with_duckdb(seed: int) -> None:
    t = _frame(seed, 40)
    con = duckdb.connect()
    con.register("t", t)
    for text in ROW_EXPRESSIONS:
        theirs = [r[0] for r in con.execute(f"select {text} from t").fetchall()]
        col = vectors.compile_expr(text).fn(_env(t))
        ours = col.arrow(t.num_rows).to_pylist()
        bad = [(i, o, x) for i, (o, x) in enumerate(zip(ours, theirs)) if not _close(o, x)]
        assert not bad, f"{text}: (row, ours, DuckDB) {bad[:3]}"


@pytest.mark.parametrize("seed", SEEDS)
def test_aggregates_agree_with_duckdb(seed: int) -> None:
    t = _frame(seed, random.Random(seed).choice([0, 1, 7, 40]))
    con = duckdb.connect()
    con.register("t", t)
    for text in AGGREGATES:
        (theirs,) = con.execute(f"select {text} from t").fetchall()[0]
        c = vectors.compile_expr(text)
        assert c.aggregate
        ours = c.fn(_env(t)).item()
        assert _close(ours, theirs), f"{text}: ours {ours!r}, DuckDB {theirs!r}"


@pytest.mark.parametrize("seed", SEEDS)
def test_aggregates_per_group_agree_with_duckdb(seed: int) -> None:
    """``group by``: each group's aggregates (NULLs, groups whose values are all NULL, float and
    boolean columns) as DuckDB gives them, over rows in any order and in group order."""
    rng = random.Random(seed)
    t = _frame(seed, 50)
    groups = rng.randint(1, 9)
    owner = [rng.randrange(groups) for _ in range(t.num_rows)]
    present = sorted(set(owner))
    dense = {g: k for k, g in enumerate(present)}
    t = t.append_column("g", pa.array([dense[g] for g in owner], pa.int64())).append_column(
        "f", pa.array([None if rng.random() < 0.3 else rng.choice([0.0, 0.5, 1.0, 1e-200])
                       for _ in owner], pa.float64()))
    if seed % 2:       # rows already in group order: taken without reordering them
        t = t.sort_by("g")
    con = duckdb.connect()
    con.register("t", t)
    texts = [*AGGREGATES, "min(f)", "max(f)", "count(*) - count(f)", "sum(f)", "avg(f)"]
    theirs = con.execute(f"select {', '.join(texts)} from t group by g order by g").fetchall()
    items = {f"x{i}": vectors.compile_expr(x) for i, x in enumerate(texts)}
    ours = vectors.grouped(items, _env(t), np.asarray(t.column("g")), len(present))
    for i, text in enumerate(texts):
        got = ours[f"x{i}"].tolist()
        want = [row[i] for row in theirs]
        bad = [(g, o, w) for g, (o, w) in enumerate(zip(got, want)) if not _close(o, w)]
        assert not bad, f"{text}: (group, ours, DuckDB) {bad[:3]}"


NAN_EXPRESSIONS = ["x > y", "x < y", "x = y", "x <> y", "x >= 0", "x <= y", "x - y > 0",
                   "greatest(x, y)", "least(x, y)", "least(x, 1.0)", "nullif(x, y)",
                   "case when x > y then 1 else 0 end", "x = y and x > 0", "not (x < y)"]
NAN_AGGREGATES = ["min(x)", "max(x)", "min(x - y)", "max(x - y)", "sum(x)", "avg(y)", "count(x)",
                  "max(case when x >= y then x end)"]


@pytest.mark.parametrize("seed", SEEDS)
def test_doubles_with_nan_and_infinities_follow_sql_not_ieee(seed: int) -> None:
    """SQL orders NaN above every number and equal to itself (IEEE has every comparison with
    NaN false); a max with a NaN is NaN and a min passes it over. A reward of +-inf makes a
    spread inf - inf. Row expressions, whole-frame and per-group aggregates, as DuckDB."""
    rng = random.Random(seed)
    n = 30
    pool = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -2.5, None]
    t = pa.table({"x": pa.array([rng.choice(pool) for _ in range(n)], pa.float64()),
                  "y": pa.array([rng.choice(pool) for _ in range(n)], pa.float64()),
                  "g": pa.array([rng.randrange(4) for _ in range(n)], pa.int64())})
    con = duckdb.connect()
    con.register("t", t)
    for text in NAN_EXPRESSIONS:
        theirs = [r[0] for r in con.execute(f"select {text} from t").fetchall()]
        ours = vectors.compile_expr(text).fn(_env(t)).arrow(n).to_pylist()
        bad = [(i, o, x) for i, (o, x) in enumerate(zip(ours, theirs)) if not _close(o, x)]
        assert not bad, f"{text}: (row, ours, DuckDB) {bad[:3]}"
    for text in NAN_AGGREGATES:
        (theirs,) = con.execute(f"select {text} from t").fetchall()[0]
        assert _close(vectors.compile_expr(text).fn(_env(t)).item(), theirs), text
    groups = sorted(set(t.column("g").to_pylist()))
    dense = pa.array([groups.index(g) for g in t.column("g").to_pylist()], pa.int64())
    want = con.execute(f"select {', '.join(NAN_AGGREGATES)} from t group by g order by g").fetchall()
    items = {text: vectors.compile_expr(text) for text in NAN_AGGREGATES}
    got = vectors.grouped(items, _env(t), np.asarray(dense), len(groups))
    for i, text in enumerate(NAN_AGGREGATES):
        bad = [(k, o, w[i]) for k, (o, w) in enumerate(zip(got[text].tolist(), want))
               if not _close(o, w[i])]
        assert not bad, f"{text}: (group, ours, DuckDB) {bad[:3]}"


@pytest.mark.parametrize("seed", SEEDS)
def test_whole_frames_without_nulls_agree_with_duckdb_and_the_one_group_path(seed: int) -> None:
    """Columns of numbers without a NULL are reduced directly over a whole frame: the values
    DuckDB gives and the per-group path gives for one group, at the edges where only the exact
    path can answer (integer sums past 64 bits, integer means past 2**53) and with NaN and
    infinities among doubles."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 9, 40])
    big = rng.choice([6, 2 ** 40, 2 ** 53, 2 ** 62 - 1])
    pool = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.5, -2.5, 1e300]
    t = pa.table({"i": pa.array([rng.randint(-big, big) for _ in range(n)], pa.int64()),
                  "x": pa.array([rng.choice(pool) for _ in range(n)], pa.float64())})
    con = duckdb.connect()
    con.register("t", t)
    texts = [f"{f}({c})" for f in ("sum", "avg", "min", "max", "count") for c in ("i", "x")]
    texts += ["sum(i::hugeint * 3)", "avg(i - 1)", "max(i::double / 3)"]
    one = vectors.grouped({x: vectors.compile_expr(x) for x in texts}, _env(t),
                          np.zeros(n, np.int64), 1)
    for text in texts:
        (theirs,) = con.execute(f"select {text} from t").fetchall()[0]
        got = vectors.compile_expr(text).fn(_env(t))
        assert _close(got.item(), theirs), f"{text}: ours {got.item()!r}, DuckDB {theirs!r}"
        (per_group,) = one[text].tolist()
        assert got.typ == one[text].typ and _close(got.item(), per_group) and \
            type(got.item()) is type(per_group), text


def test_an_aggregate_written_twice_is_taken_once_per_frame() -> None:
    """``sum(b)`` as a count and again as a denominator (the off-policy metrics' shape) is the
    same expression wherever it stands, so a frame takes it once; every item still reads its
    own value."""
    t = pa.table({"a": pa.array([3, None, 5], pa.int64()), "b": pa.array([2, 4, None], pa.int64())})
    texts = {"n": "cast(sum(b) as bigint)", "mean": "sum(a::hugeint * b) / nullif(sum(b), 0)",
             "top": "max(b)", "rows": "count(*)", "rows2": "count(*) - count(a)"}
    got = vectors.aggregates({k: vectors.compile_expr(x) for k, x in texts.items()}, _env(t))
    con = duckdb.connect()
    con.register("t", t)
    want = con.execute(f"select {', '.join(texts.values())} from t").fetchall()[0]
    assert list(got.values()) == pytest.approx(list(want))

    def aggregate_keys(text: str) -> list[str]:
        out: list[str] = []

        def walk(node: object) -> None:
            if isinstance(node, dict):
                if node.get("class") == "FUNCTION" and node["function_name"] in ("sum", "count_star"):
                    out.append(vectors._memo_key(node))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
        walk(vectors._parse(text))
        return out
    (first,) = aggregate_keys(texts["n"])
    assert first in aggregate_keys(texts["mean"])          # the same key, in another place
    assert aggregate_keys(texts["rows"])[0] in aggregate_keys(texts["rows2"])
    assert vectors._memo_key(vectors._parse("sum(a)")) != vectors._memo_key(vectors._parse("sum(b)"))


def test_parameters_and_strings() -> None:
    """A parameter ``$name`` reads the column its value is put in; strings compare as SQL's."""
    from pipeline.decide.compile import param_column
    t = pa.table({"status": ["finished", "failure", None, None], "n": [0, 2, 2, 3]})
    env = {**_env(t), param_column("all"): vectors.scalar(False),
           param_column("k"): vectors.scalar(2)}
    got = vectors.compile_expr("status = 'failure' and ($all or n = $k)").fn(env)
    assert got.arrow(4).to_pylist() == [False, True, None, False]   # NULL and false: false


def test_hugeint_arithmetic_is_exact_past_64_bits() -> None:
    """A product or sum a declaration widens to hugeint is exact where int64 would wrap; a
    cast back to bigint of a value that does not fit is an error, never a wrapped number."""
    big = 2 ** 61
    t = pa.table({"a": pa.array([big, big - 1, 3], pa.int64()),
                  "b": pa.array([7, 9, 2], pa.int64())})
    con = duckdb.connect()
    con.register("t", t)
    for text in ("sum(a::hugeint * b)", "sum(a::hugeint * b) / nullif(sum(b), 0)",
                 "max(a::hugeint * b)", "sum(a)"):
        (theirs,) = con.execute(f"select {text} from t").fetchall()[0]
        ours = vectors.compile_expr(text).fn(_env(t)).item()
        assert ours == theirs, text
    assert vectors.compile_expr("sum(a::hugeint * b)").fn(_env(t)).item() == \
        big * 7 + (big - 1) * 9 + 6 > 2 ** 63
    with pytest.raises(SqlError, match="does not fit in bigint"):
        vectors.compile_expr("cast(a::hugeint * b as bigint)").fn(_env(t))


def test_nothing_to_aggregate_is_null_and_count_is_zero() -> None:
    t = pa.table({"a": pa.array([None, None], pa.int64())})
    env = _env(t)
    for text in ("sum(a)", "avg(a)", "min(a)", "max(a)"):
        assert vectors.compile_expr(text).fn(env).item() is None, text
    assert vectors.compile_expr("count(a)").fn(env).item() == 0
    assert vectors.compile_expr("count(*)").fn(env).item() == 2
    empty = vectors.where(env, np.zeros(2, bool))
    assert vectors.compile_expr("count(*)").fn(empty).item() == 0
    assert vectors.compile_expr("count(a)").fn(empty).item() == 0
    for text, typ in (("sum(a)", vectors.HUGEINT), ("avg(a)", vectors.DOUBLE),
                      ("min(a)", vectors.BIGINT), ("max(a)", vectors.BIGINT)):
        got = vectors.compile_expr(text).fn(empty)     # no row at all: NULL, typed as over rows
        assert (got.item(), got.typ) == (None, typ), text
        got = vectors.compile_expr(text).fn(env)       # rows, all NULL: the same
        assert (got.item(), got.typ) == (None, typ), text
        per_group = vectors.grouped({"x": vectors.compile_expr(text)}, env,
                                    np.zeros(2, np.int64), 1)["x"]
        assert (per_group.tolist(), per_group.typ) == ([None], typ), text
    # NULL through arithmetic as through the per-group path: a NULL denominator, a NULL sum
    got = vectors.compile_expr("sum(a) / nullif(sum(a), 0)").fn(env)
    assert (got.item(), got.typ) == (None, vectors.DOUBLE)


def test_integer_literals_past_64_bits_are_hugeints_as_in_duckdb() -> None:
    t = pa.table({"a": pa.array([1, -2, None], pa.int64())})
    con = duckdb.connect()
    con.register("t", t)
    for text in ("a + 99999999999999999999", "a * -170141183460469231731687303715884105727 < 0",
                 "a - 9223372036854775808"):
        theirs = [r[0] for r in con.execute(f"select {text} from t").fetchall()]
        assert vectors.compile_expr(text).fn(_env(t)).tolist() == theirs, text
    with pytest.raises(SqlError, match="does not fit in 128 bits"):
        vectors.compile_expr("a + 999999999999999999999999999999999999999999")


@pytest.mark.parametrize("text, message", [
    ("a like 'x%'", "not supported"),
    ("sum(distinct a)", "distinct"),
    ("list_sum(a)", "list_sum"),
    ("a::varchar", "(?i)varchar"),
    ("sum(sum(a))", "aggregate inside"),
])
def test_what_it_cannot_compile_is_refused_when_compiled(text: str, message: str) -> None:
    with pytest.raises(SqlError, match=message):
        vectors.compile_expr(text)


def test_the_declarations_it_serves_compile() -> None:
    """Every formula of the provenance and every off-policy aggregate compiles, the latter as
    aggregates, the former as row expressions."""
    prov = vectors.compiled_items("provenance")
    assert prov and not any(c.aggregate for c in prov.values())
    agg = vectors.compiled_items("off_policy")
    assert agg and all(c.aggregate for c in agg.values())
    assert not vectors.compiled_predicate("off_policy").aggregate


def test_a_batch_with_versions_near_the_step_limit_matches_the_lake() -> None:
    """Version spans whose token-weighted sums leave 64 bits (versions near the ingest limit of
    2**62): the buffer's span sums, provenance and exact per-token staleness equal DuckDB's run
    of provenance.sql and off_policy.sql over the same rows."""
    import polars as pl

    from pipeline.decide.batch import batch_rows
    from pipeline.decide.metrics import off_policy_metrics
    from sql import loader
    v = 2 ** 61
    spans = [[{"version": v, "n_tokens": 3000}, {"version": v + 5, "n_tokens": 2000}],
             None, [{"version": v + 1, "n_tokens": 0}], []]
    n = len(spans)
    payload = pa.table({
        "partition": ["train"] * n, "uid": ["a", "a", "b", "b"], "seq": range(n),
        "min_global_steps": [v] * n, "max_global_steps": [v + 5] * n,
        "is_padding": [False] * n,
        "response_ids": pa.array([[1] * 5000, [1, 2], [], []], pa.list_(pa.int32())),
        "version_spans": pa.array(spans, pa.list_(pa.struct(
            [("version", pa.int64()), ("n_tokens", pa.int32())]))),
    })
    step = v + 9
    rows = batch_rows(payload, batch_id=0, step=step, group_steps={"a": v + 2, "b": v + 3})
    assert rows.cols["span_version_sum"].arrow(n).to_pylist() == \
        [v * 3000 + (v + 5) * 2000, None, 0, 0]
    assert rows.cols["span_version_min"].arrow(n).to_pylist() == [v, None, None, None]
    assert rows.cols["span_tokens"].arrow(n).to_pylist() == [5000, None, 0, 0]
    frame = rows.frame()
    con = duckdb.connect()
    con.register("batch_rows", frame.with_columns(
        pl.col(pl.Int128).cast(pl.Decimal(38, 0))).to_arrow())
    prov = loader.run(con, "provenance")
    for col in ("staleness", "group_span", "token_staleness_sum", "token_staleness_max"):
        assert prov.column(col).to_pylist() == frame[col].to_list(), col
    con.register("provenance", prov)
    (lake,) = loader.run(con, "off_policy").to_pylist()
    live, _ = off_policy_metrics(rows)
    assert live["training/off_policy/token_staleness_exact/mean"] == \
        pytest.approx(float(lake["token_staleness_exact_mean"]))
    assert live["training/off_policy/token_staleness_exact/max"] == lake["token_staleness_exact_max"]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_span_sums_are_the_batch_rows_view_s(seed: int) -> None:
    """A row's version-span sums (tokens covered, token-weighted version sum, oldest version
    with a token) as the lake's `batch_rows` view computes them, its own expressions run by
    DuckDB: NULL lists, empty lists, NULL spans inside a list and spans of zero tokens."""
    from pipeline.decide import compile as declared
    from pipeline.decide.batch import _span_sums
    from sql import loader
    rng = random.Random(seed)
    span = pa.struct([("version", pa.int64()), ("n_tokens", pa.int32())])

    def one() -> list | None:
        if rng.random() < 0.2:
            return None
        return [None if rng.random() < 0.15 else
                {"version": rng.randint(0, 9), "n_tokens": rng.choice([0, 0, 1, 3, 7])}
                for _ in range(rng.randint(0, 4))]
    spans = pa.chunked_array([pa.array([one() for _ in range(30)], pa.list_(span))])
    ours = _span_sums(spans, len(spans))
    items = declared.select_items(loader.load("batch_rows"), "final")
    con = duckdb.connect()
    con.register("t", pa.table({"version_spans": spans}))
    names = ("span_tokens", "span_version_sum", "span_version_min")
    theirs = con.execute(f"select {', '.join(items[n] for n in names)} from t").fetchall()
    for i, n in enumerate(names):
        want = [None if r[i] is None else int(r[i]) for r in theirs]
        assert ours[n].arrow(len(spans)).to_pylist() == want, n


def test_threads_compiling_at_once_get_the_same_answers() -> None:
    """Compiling from several threads at once (a Ray actor's or an adapter's threads): the one
    parser connection is used by one thread at a time, and every thread's expression works."""
    from concurrent.futures import ThreadPoolExecutor
    t = pa.table({"a": pa.array([1, 2, 3], pa.int64())})
    texts = [f"a * {k} + {k}" for k in range(200)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda x: vectors.compile_expr(x).fn(_env(t)).tolist(), texts))
    assert got == [[v * k + k for v in (1, 2, 3)] for k in range(200)]
