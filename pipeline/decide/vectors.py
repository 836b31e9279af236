"""Declarations compiled for numpy: the engine of a batch's provenance and off-policy metrics.

A batch is a few hundred rows. polars evaluates each expression for a fixed cost of tens of
microseconds whatever its size, so a batch's provenance formulas and metric aggregates cost most
of a `sample`, where numpy's cost per operation over a few hundred values is about a microsecond.
The expressions are the same text as everywhere else (sql/metrics/provenance.sql and
sql/metrics/off_policy.sql, which DuckDB runs over the lake): DuckDB's own parser
(`json_serialize_sql`, the dialect of the files) turns each into a tree once per process, and
the tree becomes nested Python functions over numpy columns.

What this engine takes of SQL: column references; integer, decimal, boolean and NULL literals;
``+ - * /`` (a division of doubles, as DuckDB's) and unary minus; ``abs``; comparisons; ``not``,
``and``, ``or``; ``is [not] null``; casts to bigint, hugeint and double; ``nullif``,
``coalesce``, ``greatest``, ``least``; ``case when ... then ... [else ...] end``; the aggregates ``count(*)``,
``count``, ``sum``, ``avg``, ``min``, ``max``. Anything else is refused when the declaration is
compiled (`SqlError`), never evaluated approximately.

Values follow SQL. A column is its values and their validity: NULL goes through arithmetic and
comparisons, ``and``/``or`` are three-valued, ``case`` takes a branch only where its condition
is true, aggregates skip NULLs and a sum, mean, minimum or maximum over no value is NULL. ``/``
is a floating division (IEEE: x / 0 is infinite). bigint arithmetic is 64-bit; where a
declaration casts to hugeint (to be exact past 64 bits) the arithmetic is exact: done in 64 bits
when the operands' magnitudes prove it cannot overflow, over Python integers otherwise; a sum
is exact, a mean is the exact sum divided by the count, and a cast to bigint of a value that
does not fit in 64 bits is an error.
"""
from __future__ import annotations

import json
import math
import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decide import compile as declared
from sql import loader
from sql.loader import SqlError

BIGINT, HUGEINT, DOUBLE, BOOLEAN, VARCHAR, NULL = ("bigint", "hugeint", "double", "boolean",
                                                   "varchar", "null")
SEGMENTS = "__segments"      # the frame's grouping, when its aggregates are taken per group
MEMO = "__memo"              # the aggregates a frame already took, by expression (see `_memo_key`)
_NOT_COLUMNS = (SEGMENTS, MEMO)
_INT64 = 2 ** 63
_CASTS = {"bigint": BIGINT, "int8": BIGINT, "long": BIGINT, "hugeint": HUGEINT, "int128": HUGEINT,
          "double": DOUBLE, "float8": DOUBLE}
_ARROW = {BIGINT: pa.int64(), DOUBLE: pa.float64(), BOOLEAN: pa.bool_(), VARCHAR: pa.string()}


@dataclass(frozen=True, slots=True)
class Col:
    """A column (or, from an aggregate or a literal, one value: a 0-d array) with its SQL type.
    ``valid``: where the value is not NULL (None: nowhere NULL). Values under NULL are filled
    (0 or False), so that arithmetic over them stays in range."""

    values: np.ndarray
    valid: np.ndarray | None
    typ: str

    def item(self) -> Any:
        """The value of a one-value column as Python (None for NULL)."""
        if self.valid is not None and not bool(self.valid):
            return None
        v = self.values.item() if isinstance(self.values, np.ndarray) else self.values
        return int(v) if self.typ in (BIGINT, HUGEINT) else v

    def tolist(self, n: int | None = None) -> list:
        """The values as Python, None for NULL (a one-value column spread to ``n`` rows)."""
        if n is not None and np.ndim(self.values) == 0:
            return [self.item()] * n
        values = self.values.tolist()
        if self.typ in (BIGINT, HUGEINT) and self.values.dtype == object:
            values = [int(v) for v in values]
        if self.valid is None:
            return values
        return [v if k else None for v, k in zip(values, self.valid.tolist())]

    def arrow(self, n: int | None = None) -> pa.Array:
        """The column as an Arrow array (a hugeint column that fits in 64 bits as int64, one
        that does not as a 128-bit decimal)."""
        values, valid = self.values, self.valid
        if n is not None and np.ndim(values) == 0:
            values = np.full(n, values, dtype=values.dtype if values.dtype != object else object)
            valid = None if valid is None else np.full(n, bool(valid))
        mask = None if valid is None else ~valid
        if self.typ == HUGEINT and values.dtype == object:
            return pa.array(values.tolist(), pa.decimal128(38, 0), mask=mask)
        return pa.array(values, _ARROW.get(self.typ, pa.int64()), mask=mask)


def _null(typ: str) -> Col:
    """One NULL value of type ``typ``."""
    return Col(np.array(0, dtype=np.int64), np.array(False), typ)


def column(array: pa.Array | pa.ChunkedArray) -> Col:
    """An Arrow column as a `Col` (integers as bigint, floats as double, booleans)."""
    typ = array.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return from_list(array.to_pylist(), pa.string())
    if pa.types.is_decimal(typ):
        return Col(np.array([0 if v is None else int(v) for v in array.to_pylist()], dtype=object),
                   None if array.null_count == 0 else np.asarray(pc.is_valid(array)), HUGEINT)
    kind = kind_of(typ)
    if array.null_count == 0:
        values = array.to_numpy() if isinstance(array, pa.ChunkedArray) else \
            array.to_numpy(zero_copy_only=False)
        return Col(_widen(values, kind), None, kind)
    valid = np.asarray(pc.is_valid(array))
    values = pc.fill_null(array, _DTYPES[kind](0))
    values = values.to_numpy() if isinstance(values, pa.ChunkedArray) else \
        values.to_numpy(zero_copy_only=False)
    return Col(_widen(values, kind), valid, kind)


def _widen(values: np.ndarray, kind: str) -> np.ndarray:
    if kind == BIGINT and values.dtype != np.int64:
        return values.astype(np.int64)
    return values


def scalar(value: Any) -> Col:
    """One Python value (a parameter, the step) as a column of one value, its type its own."""
    if value is None:
        return _null(NULL)
    if isinstance(value, bool):
        return Col(np.array(value), None, BOOLEAN)
    if isinstance(value, int):
        return Col(np.array(value, dtype=np.int64), None, BIGINT)
    if isinstance(value, float):
        return Col(np.array(value), None, DOUBLE)
    if isinstance(value, str):
        return Col(np.array(value, dtype=object), None, VARCHAR)
    raise SqlError(f"a value {value!r} ({type(value).__name__}) has no column form here")


def from_list(values: list, typ: pa.DataType) -> Col:
    """A Python list (None: NULL) as a column of Arrow type ``typ``."""
    if pa.types.is_string(typ):
        if None not in values:
            return Col(np.array(values, dtype=object), None, VARCHAR)
        valid = np.array([v is not None for v in values])
        return Col(np.array(["" if v is None else v for v in values], dtype=object), valid,
                   VARCHAR)
    kind = kind_of(typ)
    if None not in values:            # the common case, without a round trip through Arrow
        return Col(np.array(values, dtype=_DTYPES[kind]), None, kind)
    if values.count(None) == len(values):
        return nulls(len(values), kind)
    return column(pa.array(values, typ))


def kind_of(typ: pa.DataType) -> str:
    """The SQL type this engine gives a column of Arrow type ``typ`` (numbers and booleans)."""
    if pa.types.is_integer(typ):
        return BIGINT
    if pa.types.is_floating(typ):
        return DOUBLE
    if pa.types.is_boolean(typ):
        return BOOLEAN
    raise SqlError(f"a column of Arrow type {typ} has no numpy form here")


_DTYPES = {BIGINT: np.int64, DOUBLE: np.float64, BOOLEAN: bool}


def nulls(n: int, typ: str = BIGINT) -> Col:
    """``n`` NULLs of ``typ``."""
    if typ == VARCHAR:
        return Col(np.full(n, "", dtype=object), np.zeros(n, bool), typ)
    return Col(np.zeros(n, dtype=_DTYPES.get(typ, np.int64)), np.zeros(n, bool), typ)


def of(values: np.ndarray, typ: str = BIGINT) -> Col:
    """A column of values without NULL."""
    return Col(values, None, typ)


# --- compiling ----------------------------------------------------------------------------------
Env = Mapping[str, Col]
RowFn = Callable[[Env], Col]


@dataclass(frozen=True)
class Compiled:
    """One expression: ``fn`` evaluates it over a frame (``{name: Col}``); ``aggregate``: it
    reduces the frame's rows to one value."""

    fn: RowFn
    aggregate: bool
    reads: frozenset[str] = frozenset()     # the columns it reads (parameters included)


@cache
def _parser() -> Any:
    import duckdb
    return duckdb.connect()


_PARSING = threading.Lock()     # one DuckDB connection, used by one thread at a time


def _parse(text: str) -> dict:
    """DuckDB's tree of one SQL expression (parsed only: nothing is run)."""
    with _PARSING:
        raw = _parser().execute("select json_serialize_sql($q)",
                                {"q": "select " + text}).fetchall()[0][0]
    tree = json.loads(raw)
    if tree.get("error"):
        raise SqlError(f"cannot parse {text!r}: {tree.get('error_message', tree)}")
    (item,) = tree["statements"][0]["node"]["select_list"]
    return item


def bind(frame: dict[str, Col], params: Mapping[str, Any]) -> dict[str, Col]:
    """``frame`` with each parameter's value as the one-value column its ``$name`` reads."""
    for k, v in params.items():
        frame[declared.param_column(k)] = scalar(v)
    return frame


def compile_expr(text: str) -> Compiled:
    """Compile one SQL expression for numpy. A parameter ``$name`` reads the column
    `compile.param_column(name)`, which the caller puts in the frame (`bind`)."""
    try:
        tree = _parse(loader.PLACEHOLDER.sub(lambda m: declared.param_column(m.group(1)), text))
        c = _node(tree)
        return Compiled(c.fn, c.aggregate, frozenset(_refs(tree)))
    except (SqlError, KeyError, ValueError) as exc:
        raise SqlError(f"{text!r} cannot be compiled for numpy: {exc}") from None


@cache
def compile_cached(text: str) -> Compiled:
    """`compile_expr`, once per text and process."""
    return compile_expr(text)


@cache
def compiled_items(name: str, step: str | None = None) -> dict[str, Compiled]:
    """The select items of the named query (or one of its steps), compiled for numpy (cached per
    process)."""
    return {k: compile_expr(v) for k, v in declared.select_items(loader.load(name), step).items()}


@cache
def compiled_predicate(name: str) -> Compiled:
    """The predicate of the named query (its `where (...)` block), compiled for numpy."""
    return compile_expr(declared.predicate(loader.load(name)))


def rows(items: Mapping[str, Compiled], env: dict[str, Col]) -> dict[str, Col]:
    """Evaluate row expressions in order; each result joins ``env`` (a later item may read an
    earlier one, as a column of the frame)."""
    for name, c in items.items():
        env[name] = c.fn(env)
    return env


def aggregates(items: Mapping[str, Compiled], env: Env) -> dict[str, Any]:
    """Evaluate aggregate expressions over the rows of ``env``: ``{name: Python value}``. An
    aggregate that several items share (``sum(n_response_tokens)`` as a count and as a
    denominator) is taken once."""
    frame = {**env, MEMO: {}}
    return {name: c.fn(frame).item() for name, c in items.items()}


@dataclass(frozen=True)
class Segments:
    """A frame's rows in groups: ``order`` sorts the rows by group (None: they are in order
    already), ``starts`` is each group's first row in that order and ``counts`` its number of
    rows (every group has one)."""

    order: np.ndarray | None
    starts: np.ndarray
    counts: np.ndarray


def grouped(items: Mapping[str, Compiled], env: Env, owner: np.ndarray,
            n_groups: int) -> dict[str, Col]:
    """Evaluate aggregate expressions per group (``group by``): ``owner`` is each row's group,
    0 to ``n_groups - 1``, and every group has a row. Each result has a value per group."""
    counts = np.bincount(owner, minlength=n_groups)
    if len(counts) != n_groups or not counts.all():
        raise SqlError(f"grouped aggregates: every one of the {n_groups} groups needs a row")
    starts = np.zeros(n_groups, np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    # rows already in group order (a poll's new groups, put one after the other) need no
    # reordering of every column each aggregate reads
    order = None if len(owner) < 2 or bool((owner[1:] >= owner[:-1]).all()) else \
        np.argsort(owner, kind="stable")
    frame = {**env, SEGMENTS: Segments(order, starts, counts), MEMO: {}}
    return {name: c.fn(frame) for name, c in items.items()}


def true(c: Col) -> np.ndarray:
    """Where a boolean column is true (NULL is not)."""
    return c.values if c.valid is None else c.values & c.valid


def where(env: Env, mask: np.ndarray) -> dict[str, Col]:
    """The rows of ``env`` where ``mask`` holds."""
    if mask.all():
        return dict(env)
    return {k: Col(c.values[mask], None if c.valid is None else c.valid[mask], c.typ)
            for k, c in env.items() if k not in _NOT_COLUMNS}


def _refs(tree: Any) -> set[str]:
    """The column names a parsed expression reads."""
    if isinstance(tree, dict):
        if tree.get("class") == "COLUMN_REF":
            return {tree["column_names"][-1]}
        return set().union(*(_refs(v) for v in tree.values()))
    if isinstance(tree, list):
        return set().union(*(_refs(v) for v in tree))
    return set()


def _node(n: dict) -> Compiled:
    cls = n["class"]
    if cls == "COLUMN_REF":
        name = n["column_names"][-1]

        def ref(env: Env) -> Col:
            try:
                return env[name]
            except KeyError:
                raise SqlError(f"no column {name!r} (the frame has {sorted(env)})") from None
        return Compiled(ref, False)
    if cls == "CONSTANT":
        value = _literal(n["literal"])
        return Compiled(lambda env: value, False)
    if cls == "CAST":
        typ = _CASTS.get(n["type_expr"]["type_name"].lower())
        if typ is None:
            raise SqlError(f"cast to {n['type_expr']['type_name']} is not supported")
        return _unary(_node(n["child"]), lambda c: _cast(c, typ))
    if cls == "COMPARISON":
        op = _COMPARE.get(n["type"])
        if op is None:
            raise SqlError(f"comparison {n['type']} is not supported")
        return _nary([_node(n["left"]), _node(n["right"])], lambda a, b: _compare(op, a, b))
    if cls == "CONJUNCTION":
        fn = {"CONJUNCTION_AND": _and, "CONJUNCTION_OR": _or}.get(n["type"])
        if fn is None:
            raise SqlError(f"{n['type']} is not supported")
        return _nary([_node(c) for c in n["children"]], lambda *cs: _fold(fn, cs))
    if cls == "OPERATOR":
        return _operator(n)
    if cls == "CASE":
        return _case(n)
    if cls == "FUNCTION":
        return _function(n)
    raise SqlError(f"{cls} expressions are not supported")


def _literal(lit: dict) -> Col:
    kind, text = lit["kind"], lit.get("text", "")
    if kind == "NULL_LITERAL":
        return _null(NULL)
    if kind in ("INTEGER", "BIGINT"):
        value = int(text)
        if -_INT64 <= value < _INT64:
            return Col(np.array(value, dtype=np.int64), None, BIGINT)
        if -2 ** 127 <= value < 2 ** 127:      # DuckDB reads it as a hugeint
            return Col(np.array(value, dtype=object), None, HUGEINT)
        raise SqlError(f"the integer literal {text} does not fit in 128 bits")
    if kind in ("NUMERIC", "DECIMAL", "DOUBLE", "FLOAT"):
        return Col(np.array(float(text)), None, DOUBLE)
    if kind == "BOOLEAN":
        return Col(np.array(text.lower() == "true"), None, BOOLEAN)
    if kind in ("VARCHAR", "STRING"):
        return Col(np.array(text, dtype=object), None, VARCHAR)
    raise SqlError(f"a {kind} literal is not supported")


def _unary(child: Compiled, fn: Callable[[Col], Col]) -> Compiled:
    inner = child.fn
    return Compiled(lambda env: fn(inner(env)), child.aggregate)


def _nary(children: list[Compiled], fn: Callable[..., Col]) -> Compiled:
    fns = [c.fn for c in children]
    if len(fns) == 2:
        a, b = fns
        return Compiled(lambda env: fn(a(env), b(env)), any(c.aggregate for c in children))
    return Compiled(lambda env: fn(*(f(env) for f in fns)), any(c.aggregate for c in children))


def _operator(n: dict) -> Compiled:
    kids = [_node(c) for c in n["children"]]
    t = n["type"]
    if t == "OPERATOR_NOT":
        return _unary(kids[0], _not)
    if t == "OPERATOR_IS_NULL":
        return _unary(kids[0], lambda c: Col(_is_null(c), None, BOOLEAN))
    if t == "OPERATOR_IS_NOT_NULL":
        return _unary(kids[0], lambda c: Col(~_is_null(c), None, BOOLEAN))
    if t == "OPERATOR_COALESCE":
        return _nary(kids, lambda *cs: _fold(_coalesce, cs))
    raise SqlError(f"{t} is not supported")


def _function(n: dict) -> Compiled:
    name = n["function_name"].lower()
    args = [_node(a["expression"]) for a in n["arguments"]]
    if n.get("distinct") or n.get("filter") or (n.get("order_bys") or {}).get("orders"):
        raise SqlError(f"{name}(distinct / filter / order by) is not supported")
    if name in _AGGREGATES:
        if any(a.aggregate for a in args):
            raise SqlError(f"an aggregate inside {name}() is not supported")
        per_group = _AGGREGATES[name]
        key = _memo_key(n)
        if name == "count_star":
            def count_star(env: Env) -> Col:
                seg = env.get(SEGMENTS)
                n = _height(env) if seg is None else seg.counts
                return Col(np.asarray(n, dtype=np.int64), None, BIGINT)
            return Compiled(_memoized(key, count_star), True)
        (arg,) = args
        inner = arg.fn

        def aggregate(env: Env) -> Col:
            seg = env.get(SEGMENTS)
            if seg is None:
                return _whole(name, inner(env), _height(env))
            return per_group(_in_groups(inner(env), seg), seg)
        return Compiled(_memoized(key, aggregate), True)
    if name in _ARITH and len(args) == 2:
        op = _ARITH[name]
        return _nary(args, lambda a, b: _arith(op, a, b))
    if name == "/" and len(args) == 2:
        return _nary(args, _divide)
    if name == "-" and len(args) == 1:
        return _unary(args[0], _negate)
    if name == "abs" and len(args) == 1:
        return _unary(args[0], lambda c: _exact_unary(np.abs, c))
    if name == "nullif" and len(args) == 2:
        return _nary(args, _nullif)
    if name in ("greatest", "least") and args:
        # NaN, above every number in SQL, wins a greatest and loses a least
        pick = np.maximum if name == "greatest" else np.fmin
        return _nary(args, lambda *cs: _fold(lambda a, b: _extremum(pick, a, b), cs))
    raise SqlError(f"function {name}() is not supported")


def _memo_key(n: dict) -> str:
    """An aggregate's expression as text, the same wherever it is written (DuckDB's tree without
    where in the query it stands and what it is called)."""
    def bare(t: Any) -> Any:
        if isinstance(t, dict):
            return {k: bare(v) for k, v in t.items() if k not in ("query_location", "alias")}
        if isinstance(t, list):
            return [bare(v) for v in t]
        return t
    return json.dumps(bare(n), sort_keys=True)


def _memoized(key: str, fn: Callable[[Env], Col]) -> Callable[[Env], Col]:
    """``fn``, taken once per frame that keeps a memo (`aggregates`, `grouped`): an aggregate's
    value depends on the frame alone, wherever the expression stands."""
    def once(env: Env) -> Col:
        memo = env.get(MEMO)
        if memo is None:
            return fn(env)
        got = memo.get(key)
        if got is None:
            got = memo[key] = fn(env)
        return got
    return once


def _height(env: Env) -> int:
    for k, c in env.items():
        if k not in _NOT_COLUMNS and np.ndim(c.values):
            return len(c.values)
    return 0


# --- values -------------------------------------------------------------------------------------
def _valid(a: Col, b: Col) -> np.ndarray | None:
    if a.valid is None:
        return b.valid
    if b.valid is None:
        return a.valid
    return a.valid & b.valid


def _num_type(a: Col, b: Col) -> str:
    types = {a.typ, b.typ} - {NULL}
    if DOUBLE in types:
        return DOUBLE
    if HUGEINT in types:
        return HUGEINT
    if types == {BOOLEAN}:
        return BOOLEAN
    return BIGINT


def _max_abs(values: np.ndarray) -> int:
    if values.size == 0:
        return 0
    if values.dtype == object:
        return max(abs(int(v)) for v in values.flat)
    return max(abs(int(values.max())), abs(int(values.min())))


def _arith(op: Callable, a: Col, b: Col) -> Col:
    typ = _num_type(a, b)
    x, y = a.values, b.values
    if typ == DOUBLE:        # IEEE, as SQL's doubles: inf - inf is NaN, an overflow inf, silently
        with np.errstate(over="ignore", invalid="ignore"):
            return Col(op(x.astype(np.float64), y.astype(np.float64)), _valid(a, b), DOUBLE)
    if typ == HUGEINT and x.dtype != object and y.dtype != object:
        # exact: 64 bits only when the operands' magnitudes prove the result fits
        mx, my = _max_abs(x), _max_abs(y)
        worst = mx * my if op is operator.mul else mx + my
        if worst >= _INT64:
            x, y = x.astype(object), y.astype(object)
    elif typ == HUGEINT:
        x, y = x.astype(object), y.astype(object)
    return Col(op(x, y), _valid(a, b), typ)


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _exact_unary(fn: Callable, c: Col) -> Col:
    """``fn`` (negation, absolute value) of one column; a hugeint whose magnitude reaches 2**63
    goes to Python integers first, as `_arith` does."""
    x = c.values
    if c.typ == HUGEINT and x.dtype != object and _max_abs(x) >= _INT64:
        x = x.astype(object)
    return Col(fn(x), c.valid, c.typ)


def _negate(c: Col) -> Col:
    return _exact_unary(operator.neg, c)


def _divide(a: Col, b: Col) -> Col:
    """``/`` as DuckDB takes it: both sides as doubles, IEEE division (x / 0 is infinite, 0 / 0
    not a number), NULL where either side is."""
    valid = _valid(a, b)
    if not np.ndim(a.values) and not np.ndim(b.values):    # one value (of aggregates)
        x, y = float(a.values), float(b.values)
        q = x / y if y else (math.copysign(math.inf, x) * math.copysign(1.0, y) if x
                             else math.nan)
        return Col(np.array(q), valid, DOUBLE)
    x, y = a.values.astype(np.float64), b.values.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return Col(np.true_divide(x, y), valid, DOUBLE)


def _compare(op: Callable, a: Col, b: Col) -> Col:
    x, y = a.values, b.values
    nx, ny = _nans(x), _nans(y)
    if nx is not None or ny is not None:
        return Col(_sql_order(op, x, y, nx, ny), _valid(a, b), BOOLEAN)
    return Col(op(x, y), _valid(a, b), BOOLEAN)


def _nans(x: np.ndarray) -> np.ndarray | None:
    """Where a double column holds NaN (None: nowhere)."""
    if x.dtype.kind != "f":
        return None
    nan = np.isnan(x)
    return nan if nan.any() else None


def _sql_order(op: Callable, x: np.ndarray, y: np.ndarray, nx: np.ndarray | None,
               ny: np.ndarray | None) -> np.ndarray:
    """A comparison in SQL's order of doubles, where NaN is above every number (+inf
    included) and equal to itself; IEEE's, which numpy follows, has every comparison with NaN
    false (but ``<>``)."""
    nx = np.zeros(np.shape(x), bool) if nx is None else nx
    ny = np.zeros(np.shape(y), bool) if ny is None else ny
    with np.errstate(invalid="ignore"):
        eq = (nx == ny) & (nx | (x == y))
        lt = (~nx & ny) | (~nx & ~ny & (x < y))
        gt = (nx & ~ny) | (~nx & ~ny & (x > y))
    return {operator.eq: eq, operator.ne: ~eq, operator.lt: lt, operator.gt: gt,
            operator.le: lt | eq, operator.ge: gt | eq}[op]


_COMPARE = {"COMPARE_EQUAL": operator.eq, "COMPARE_NOTEQUAL": operator.ne,
            "COMPARE_LESSTHAN": operator.lt, "COMPARE_GREATERTHAN": operator.gt,
            "COMPARE_LESSTHANOREQUALTO": operator.le,
            "COMPARE_GREATERTHANOREQUALTO": operator.ge}


def _known(c: Col) -> np.ndarray:
    """Where ``c`` is not NULL, as an array of its shape."""
    return np.ones(np.shape(c.values), bool) if c.valid is None else c.valid


def _common(a: Col, b: Col) -> tuple[str, np.ndarray, np.ndarray]:
    """The type two columns meet in (a NULL literal takes the other's) and their values in it."""
    typ = _num_type(a, b) if NULL not in (a.typ, b.typ) else (a.typ if b.typ == NULL else b.typ)
    return typ, _like(a.values, typ, b.values), _like(b.values, typ, a.values)


def _truth(c: Col) -> tuple[np.ndarray, np.ndarray]:
    """(true here, known here) of a boolean column."""
    v = c.values.astype(bool, copy=False)
    if c.valid is None:
        return v, _known(c)
    return v & c.valid, c.valid


def _not(c: Col) -> Col:
    return Col(~c.values.astype(bool, copy=False), c.valid, BOOLEAN)


def _and(a: Col, b: Col) -> Col:
    if a.valid is None and b.valid is None:
        return Col(a.values & b.values, None, BOOLEAN)
    ta, ka = _truth(a)
    tb, kb = _truth(b)
    false = (ka & ~ta) | (kb & ~tb)
    return Col(ta & tb, false | (ka & kb), BOOLEAN)


def _or(a: Col, b: Col) -> Col:
    if a.valid is None and b.valid is None:
        return Col(a.values | b.values, None, BOOLEAN)
    ta, ka = _truth(a)
    tb, kb = _truth(b)
    return Col(ta | tb, ta | tb | (ka & kb), BOOLEAN)


def _fold(fn: Callable[[Col, Col], Col], cols: tuple[Col, ...]) -> Col:
    out = cols[0]
    for c in cols[1:]:
        out = fn(out, c)
    return out


def _is_null(c: Col) -> np.ndarray:
    if c.valid is None:
        return np.zeros(np.shape(c.values), bool)
    return ~c.valid


def _like(values: np.ndarray, typ: str, other: np.ndarray) -> np.ndarray:
    if typ == DOUBLE:
        return values.astype(np.float64)
    if typ == HUGEINT and (values.dtype == object or other.dtype == object):
        return values.astype(object)
    return values


def _pick(cond: np.ndarray, a: Col, b: Col) -> Col:
    """Where ``cond``: ``a``, else ``b`` (values and validity)."""
    typ, x, y = _common(a, b)
    return Col(np.where(cond, x, y), np.where(cond, _known(a), _known(b)), typ)


def _extremum(pick: np.ufunc, a: Col, b: Col) -> Col:
    """``greatest`` / ``least`` of two columns, as DuckDB's: NULL is passed over (NULL only
    where both are)."""
    typ, x, y = _common(a, b)
    both = pick(x, y)
    if a.valid is None and b.valid is None:
        return Col(both, None, typ)
    va, vb = _known(a), _known(b)
    return Col(np.where(va & vb, both, np.where(va, x, y)), va | vb, typ)


def _coalesce(a: Col, b: Col) -> Col:
    if a.valid is None:
        return a
    return _pick(a.valid, a, b)


def _nullif(a: Col, b: Col) -> Col:
    same, known = _truth(_compare(operator.eq, a, b))
    if not np.any(same):
        return a
    valid = ~same if a.valid is None else a.valid & ~same
    return Col(np.where(same, np.zeros_like(a.values), a.values), valid, a.typ)


def _case(n: dict) -> Compiled:
    checks = [(_node(c["when_expr"]), _node(c["then_expr"])) for c in n["case_checks"]]
    other = _node(n["else_expr"]) if n.get("else_expr") else None
    parts = [c for pair in checks for c in pair] + ([other] if other else [])
    null = _null(NULL)

    def case(env: Env) -> Col:
        out = other.fn(env) if other is not None else null
        for when, then in reversed(checks):      # the first true condition wins
            take, _ = _truth(when.fn(env))
            out = _pick(take, then.fn(env), out)
        return out
    return Compiled(case, any(p.aggregate for p in parts))


def _cast(c: Col, typ: str) -> Col:
    if typ == c.typ or c.typ == NULL:
        return Col(c.values, c.valid, typ)
    if typ == DOUBLE:
        return Col(c.values.astype(np.float64), c.valid, DOUBLE)
    if typ == HUGEINT:
        if c.typ not in (BIGINT, BOOLEAN):
            raise SqlError(f"cast of {c.typ} to hugeint is not supported")
        return Col(c.values.astype(np.int64), c.valid, HUGEINT)
    # to bigint
    if c.typ == DOUBLE:
        raise SqlError("cast of double to bigint is not supported")
    values = c.values
    if values.dtype == object:
        ints = [int(v) for v in values.flat]
        if any(not -_INT64 <= v < _INT64 for v in ints):
            raise SqlError("a value does not fit in bigint (64 bits)")
        values = np.array(ints, dtype=np.int64).reshape(np.shape(values))
    return Col(values.astype(np.int64, copy=False), c.valid, BIGINT)


# --- aggregates per group -----------------------------------------------------------------------
def _in_groups(c: Col, seg: Segments) -> Col:
    """``c``'s rows in group order (a one-value column spread to every row)."""
    order = seg.order
    if order is None and np.ndim(c.values) and (c.valid is None or np.ndim(c.valid)):
        return c
    n = len(order) if order is not None else int(seg.counts[0])
    values = (c.values if order is None else c.values[order]) if np.ndim(c.values) else \
        np.full(n, c.values)
    if c.valid is None:
        return Col(values, None, c.typ)
    valid = (c.valid if order is None else c.valid[order]) if np.ndim(c.valid) else \
        np.full(n, bool(c.valid))
    return Col(values, valid, c.typ)


def _reduce(ufunc: np.ufunc, values: np.ndarray, seg: Segments) -> np.ndarray:
    """``ufunc`` over each group's rows (in group order): one value per group. One group (a
    whole frame) is reduced whole, pairwise for a float sum, as numpy's ``sum``."""
    with np.errstate(over="ignore", invalid="ignore"):     # IEEE sums, silently (`_arith`)
        if len(seg.starts) == 1:
            return ufunc.reduce(values, keepdims=True)
        return ufunc.reduceat(values, seg.starts)


def _g_count(c: Col, seg: Segments) -> np.ndarray:
    if c.valid is None:
        return seg.counts
    if len(seg.starts) == 1:
        return np.array([np.count_nonzero(c.valid)], np.int64)
    return np.add.reduceat(c.valid.astype(np.int64), seg.starts)


def _some(counts: np.ndarray, c: Col) -> np.ndarray | None:
    """Valid where a group had a value of ``c`` (None: every group had one, as every group
    has a row)."""
    return None if c.valid is None or counts.all() else counts > 0


def _g_sums(c: Col, seg: Segments) -> tuple[np.ndarray, np.ndarray, float]:
    """(each group's exact sum, its count of values, a bound on every sum's magnitude: inf for
    doubles and for sums past 64 bits)."""
    counts = _g_count(c, seg)
    values = c.values if c.valid is None else np.where(c.valid, c.values, 0)
    if c.typ == DOUBLE:
        return _reduce(np.add, values.astype(np.float64, copy=False), seg), counts, math.inf
    if values.dtype != object:
        bound = _max_abs(values) * int(seg.counts.max())
        if bound < _INT64:
            return _reduce(np.add, values.astype(np.int64, copy=False), seg), counts, bound
    ends = [*seg.starts[1:].tolist(), len(values)]
    return np.array([sum(int(v) for v in values[a:b]) for a, b in
                     zip(seg.starts.tolist(), ends)], dtype=object), counts, math.inf


def _g_sum(c: Col, seg: Segments) -> Col:
    sums, counts, _ = _g_sums(c, seg)
    return Col(sums, _some(counts, c), _result_type("sum", c.typ))


def _g_avg(c: Col, seg: Segments) -> Col:
    sums, counts, bound = _g_sums(c, seg)
    div = np.maximum(counts, 1)
    if sums.dtype == np.float64 or bound < 2 ** 53:
        means = sums / div       # integers below 2**53 convert exactly: one rounding, as Python's
    else:
        means = np.array([int(a) / int(b) for a, b in zip(sums.tolist(), div.tolist())])
    return Col(means.astype(np.float64, copy=False), _some(counts, c), DOUBLE)


def _g_extreme(ufunc: np.ufunc, low: bool) -> Callable[[Col, Segments], Col]:
    def reduce(c: Col, seg: Segments) -> Col:
        counts = _g_count(c, seg)
        values = c.values
        if values.dtype == object:          # integers past 64 bits: Python, group by group
            ends = [*seg.starts[1:].tolist(), len(values)]
            valid = np.ones(len(values), bool) if c.valid is None else c.valid
            pick = min if low else max
            out = [pick((int(v) for v, k in zip(values[a:b], valid[a:b]) if k), default=0)
                   for a, b in zip(seg.starts.tolist(), ends)]
            return Col(np.array(out, dtype=object), _some(counts, c), c.typ)
        if c.typ == BOOLEAN:
            values = values.astype(np.int8)
        if c.valid is not None:
            if values.dtype.kind == "f":      # fmin passes a NaN over, maximum loses to -inf
                fill = np.nan if low else -np.inf
            else:
                info = np.iinfo(values.dtype)
                fill = info.max if low else info.min
            values = np.where(c.valid, values, fill)
        out = _reduce(ufunc, values, seg)
        if c.typ == BOOLEAN:
            out = out.astype(bool)
        return Col(out, _some(counts, c), c.typ)
    return reduce


def _g_count_col(c: Col, seg: Segments) -> Col:
    return Col(np.asarray(_g_count(c, seg), dtype=np.int64), None, BIGINT)


# each aggregate once, per group; over a whole frame it is the one group of all its rows (`_whole`)
# (NaN is above every number in SQL: a max with one is NaN, a min passes it over unless it is
# all there is; numpy's maximum and fmin do just that)
_AGGREGATES = {"sum": _g_sum, "avg": _g_avg, "mean": _g_avg, "min": _g_extreme(np.fmin, True),
               "max": _g_extreme(np.maximum, False), "count": _g_count_col, "count_star": None}


def _result_type(name: str, typ: str) -> str:
    """The type of aggregate ``name`` over a column of ``typ`` (DuckDB's: a sum of integers is
    hugeint, a mean double, a count bigint, a minimum or maximum its column's)."""
    if name == "sum":
        return DOUBLE if typ == DOUBLE else HUGEINT
    return {"avg": DOUBLE, "mean": DOUBLE, "count": BIGINT}.get(name, typ)


@lru_cache(maxsize=256)
def _one_group(n: int) -> Segments:
    """The rows of a frame of ``n`` rows as one group, in order."""
    return Segments(None, np.zeros(1, np.int64), np.array([n], np.int64))


def _whole_plain(name: str, values: np.ndarray, typ: str, n: int) -> Col | None:
    """`_whole` of a column of numbers without NULL, reduced directly (a batch's off-policy
    metrics take some twenty of these): the very values the one-group path gives, or None where
    only that path can (an integer sum that may pass 64 bits, an integer mean past 2**53)."""
    if name == "count":
        return Col(np.array(n, dtype=np.int64), None, BIGINT)
    if name in ("min", "max"):
        if values.dtype.kind == "f":     # as `_g_extreme`: fmin passes NaN over, maximum keeps it
            with np.errstate(over="ignore", invalid="ignore"):
                out = (np.fmin if name == "min" else np.maximum).reduce(values)
        else:
            out = values.min() if name == "min" else values.max()
        return Col(np.asarray(out), None, typ)
    if name not in ("sum", "avg", "mean"):
        return None
    if typ == DOUBLE:
        with np.errstate(over="ignore", invalid="ignore"):     # IEEE sums, as `_reduce`
            total = np.add.reduce(values.astype(np.float64, copy=False))
        return Col(np.asarray(total if name == "sum" else total / n), None, DOUBLE)
    bound = _max_abs(values) * n
    if bound >= (_INT64 if name == "sum" else 2 ** 53):
        return None
    total = np.add.reduce(values.astype(np.int64, copy=False))
    if name == "sum":
        return Col(np.asarray(total), None, HUGEINT)
    return Col(np.asarray(total / np.int64(n)), None, DOUBLE)


def _whole(name: str, c: Col, n: int) -> Col:
    """Aggregate ``name`` over a whole frame of ``n`` rows: the per-group reducer over the one
    group of all its rows, its value as one value (a 0-d column). A frame of no rows has no
    group: its count is 0, any other aggregate NULL."""
    if n == 0:
        if name == "count":
            return Col(np.array(0, dtype=np.int64), None, BIGINT)
        return _null(_result_type(name, c.typ))
    values = c.values
    if c.valid is not None and np.ndim(c.valid) and not c.valid.any():    # NULL in every row
        return Col(np.array(0, dtype=np.int64), None, BIGINT) if name == "count" else \
            _null(_result_type(name, c.typ))
    if c.valid is None and values.ndim == 1 and values.dtype.kind in "if" and \
            c.typ in (BIGINT, HUGEINT, DOUBLE):
        got = _whole_plain(name, values, c.typ, n)
        if got is not None:
            return got
    seg = _one_group(n)
    out = _AGGREGATES[name](_in_groups(c, seg), seg)
    valid = None if out.valid is None or out.valid[0] else np.array(False)
    return Col(out.values[0, ...], valid, out.typ)
