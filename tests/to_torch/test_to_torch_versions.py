"""Per-token weight versions and staleness from `batch_to_torch(..., token_versions=True)`, and the
refusal of stale rows without behaviour log-probs (`require_log_probs_when_stale=True`)."""
from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline.to_torch import TensorPool, batch_to_torch
from pipeline.to_torch.convert import BatchFormatError
from pipeline.to_torch.versions import StaleWithoutLogProbsError
from schemas import VERSION_SPAN
from tests.support.sql_runs import shared_run
from tests.support.torch_reference import BATCH_SCHEMA, rechunk, row

SCHEMA = pa.schema([*BATCH_SCHEMA, ("version_spans", pa.list_(VERSION_SPAN)),
                    ("uid", pa.string()), ("session_id", pa.int32()), ("index", pa.int32())])
KEYS = {"padded": ["responses_token_staleness", "responses_token_versions", "token_staleness",
                   "token_versions"],
        "packed": ["token_staleness", "token_versions"]}


def _row(prompt: list[int], response: list[int], *, mn: int, mx: int, staleness: int,
         spans: list[tuple[int, int]] | None = None, logp: list[float] | None = None,
         uid: str = "u", session: int = 0, is_padding: bool = False) -> dict:
    out = row(prompt, response, None, logp, mn=mn, mx=mx, staleness=staleness,
              is_padding=is_padding)
    out.update(version_spans=None if spans is None else
               [{"version": v, "n_tokens": k} for v, k in spans],
               uid=uid, session_id=session, index=0)
    return out


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


# g = 5 everywhere below: the newest weights are version 4, and staleness = 4 - max_global_steps
MIXED = _table([
    _row([1, 2], [7, 8, 9], mn=2, mx=4, staleness=0, spans=[(2, 1), (4, 2)]),  # spans
    _row([3], [5, 6], mn=3, mx=3, staleness=1),                                 # one version
    _row([], [4, 4, 4, 4], mn=1, mx=3, staleness=1),                           # range, no spans
    _row([9, 9, 9], [], mn=4, mx=4, staleness=0),                               # no response
])


def test_padded_versions_are_exact_from_spans_or_one_version_and_the_oldest_for_a_range() -> None:
    t = batch_to_torch(MIXED, "padded", token_versions=True)
    assert t["token_versions"].tolist() == [[0, 0, 2, 4, 4], [0, 3, 3, 0, 0],
                                            [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]]
    assert t["token_staleness"].tolist() == [[0, 0, 2, 0, 0], [0, 1, 1, 0, 0],
                                             [3, 3, 3, 3, 0], [0, 0, 0, 0, 0]]
    assert t["responses_token_versions"].tolist() == [[2, 4, 4, 0], [3, 3, 0, 0], [1, 1, 1, 1],
                                                      [0, 0, 0, 0]]
    assert t["responses_token_staleness"].tolist() == [[2, 0, 0, 0], [1, 1, 0, 0], [3, 3, 3, 3],
                                                       [0, 0, 0, 0]]
    for k in KEYS["padded"]:
        assert t[k].dtype == torch.int64
    # zero off the response, as response_mask is: the two agree on where the response is
    on = t["response_mask"].bool()
    assert (t["token_versions"][~on] == 0).all() and (t["token_staleness"][~on] == 0).all()
    assert on.sum() == 9


def test_packed_versions_follow_each_rows_prompt() -> None:
    t = batch_to_torch(MIXED, "packed", token_versions=True)
    assert t["token_versions"].tolist() == [[0, 0, 2, 4, 4, 0, 3, 3, 1, 1, 1, 1, 0, 0, 0]]
    assert t["token_staleness"].tolist() == [[0, 0, 2, 0, 0, 0, 1, 1, 3, 3, 3, 3, 0, 0, 0]]
    assert t["token_versions"].shape == t["input_ids"].shape


def test_a_token_of_the_newest_weights_has_staleness_zero_and_one_older_one() -> None:
    one = _table([_row([1], [2, 3], mn=3, mx=4, staleness=0, spans=[(4, 1), (3, 1)])])
    t = batch_to_torch(one, "padded", token_versions=True)
    assert t["responses_token_staleness"].tolist() == [[0, 1]]
    assert t["responses_token_versions"].tolist() == [[4, 3]]


def test_zero_token_runs_and_null_spans_beside_spans() -> None:
    t = _table([_row([1], [2, 3], mn=1, mx=2, staleness=1, spans=[(1, 0), (2, 2)]),
                _row([1], [2], mn=0, mx=2, staleness=1)])
    out = batch_to_torch(t, "padded", token_versions=True)
    assert out["responses_token_versions"].tolist() == [[2, 2], [0, 0]]
    assert out["responses_token_staleness"].tolist() == [[1, 1], [3, 0]]


def test_without_the_flag_the_tensors_are_the_usual_ones() -> None:
    for layout in KEYS:
        plain = batch_to_torch(MIXED, layout)
        assert not set(KEYS[layout]) & set(plain)
        more = batch_to_torch(MIXED, layout, token_versions=True)
        assert sorted(set(more) - set(plain)) == KEYS[layout]
        for k in plain:
            assert torch.equal(plain[k], more[k]), k


def test_a_table_without_a_version_spans_column_takes_the_rows_range() -> None:
    t = batch_to_torch(MIXED.drop_columns(["version_spans"]), "padded", token_versions=True)
    assert t["responses_token_versions"][0].tolist() == [2, 2, 2, 0]


def test_spans_that_do_not_cover_the_response_are_named() -> None:
    bad = _table([_row([1], [2, 3], mn=1, mx=1, staleness=0, spans=[(1, 2)]),
                  _row([1], [2, 3], mn=1, mx=1, staleness=0, spans=[(1, 1)]),
                  _row([1], [2, 3], mn=1, mx=1, staleness=0, spans=[(1, 3), (1, -1)])])
    with pytest.raises(BatchFormatError, match=r"'version_spans': in rows \[1, 2\]"):
        batch_to_torch(bad, "padded", token_versions=True)


def test_zero_rows_give_empty_version_tensors() -> None:
    t = batch_to_torch(MIXED.slice(0, 0), "padded", token_versions=True)
    assert tuple(t["token_versions"].shape) == (0, 0)
    assert tuple(batch_to_torch(MIXED.slice(0, 0), "packed",
                                token_versions=True)["token_staleness"].shape) == (1, 0)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_pooled_buffers_hold_the_same_versions(layout: str) -> None:
    pool = TensorPool()
    fresh = batch_to_torch(MIXED, layout, token_versions=True)
    for _ in range(2):                   # the second call reuses the first one's buffers
        pooled = batch_to_torch(MIXED, layout, token_versions=True, pool=pool)
        for k in KEYS[layout]:
            assert torch.equal(pooled[k], fresh[k]), k
        pool.give_back(pooled)


@st.composite
def _rows(draw: st.DrawFn) -> list[dict]:
    rows = []
    for i in range(draw(st.integers(0, 8))):
        p, r = draw(st.integers(0, 4)), draw(st.integers(0, 5))
        mn = draw(st.integers(0, 6))
        mx = mn + draw(st.integers(0, 2))
        spans = None
        if draw(st.booleans()):
            cuts = sorted(draw(st.lists(st.integers(0, r), max_size=2)))
            bounds = [0, *cuts, r]
            spans = [(draw(st.integers(mn, mx)), b - a) for a, b in zip(bounds, bounds[1:])]
        rows.append(_row(list(range(p)), list(range(r)), mn=mn, mx=mx,
                         staleness=draw(st.integers(-1, 3)), spans=spans, uid=f"u{i}"))
    return rows


def _expected(rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """Per row, (versions, staleness) of its response tokens, the obvious way."""
    out = []
    for x in rows:
        if x["version_spans"] is None:
            v = [x["min_global_steps"]] * len(x["response_ids"])
        else:
            v = [s["version"] for s in x["version_spans"] for _ in range(s["n_tokens"])]
        newest = x["staleness"] + x["max_global_steps"]
        out.append((v, [newest - a for a in v]))
    return out


@given(rows=_rows(), cuts=st.lists(st.integers(0, 8), max_size=3), sliced=st.booleans())
def test_every_response_token_gets_its_version_in_both_layouts(rows: list[dict], cuts: list[int],
                                                              sliced: bool) -> None:
    table = _table(rows)
    if sliced:                          # a slice of a longer table, offsets not at 0
        pad = [_row([1], [1, 1], mn=0, mx=0, staleness=0, spans=[(0, 2)])]
        table = _table(pad + rows + pad).combine_chunks().slice(1, len(rows))
    table = rechunk(table, cuts)
    want = _expected(rows)
    padded = batch_to_torch(table, "padded", token_versions=True)
    packed = batch_to_torch(table, "packed", token_versions=True)
    at = 0
    for i, (x, (v, s)) in enumerate(zip(rows, want)):
        p, r = len(x["prompt_ids"]), len(v)
        assert padded["token_versions"][i, p:p + r].tolist() == v
        assert padded["token_staleness"][i, p:p + r].tolist() == s
        assert padded["responses_token_versions"][i, :r].tolist() == v
        assert padded["responses_token_staleness"][i, :r].tolist() == s
        assert not padded["token_versions"][i, :p].any()
        assert not padded["token_versions"][i, p + r:].any()
        assert not padded["responses_token_staleness"][i, r:].any()
        assert packed["token_versions"][0, at + p:at + p + r].tolist() == v
        assert packed["token_staleness"][0, at + p:at + p + r].tolist() == s
        assert not packed["token_versions"][0, at:at + p].any()
        at += p + r
    assert packed["token_versions"].shape[1] == at


def test_a_sampled_batchs_token_staleness_peaks_at_its_certified_worst() -> None:
    """On a real run (odd sessions report spans): the largest token staleness of a row is the
    provenance's token_staleness_max where it has spans, else its worst staleness."""
    checked = 0
    for b in shared_run("async").batches:
        t = b.to_torch("padded", token_versions=True)
        cert = b.certificate.rows.to_pylist()
        lengths = t["response_lengths"].tolist()
        for i, c in enumerate(cert):
            if lengths[i] == 0:
                continue
            peak = int(t["responses_token_staleness"][i, :lengths[i]].max())
            want = c["token_staleness_max"] if c["span_tokens"] is not None \
                else c["staleness_worst"]
            assert peak == want, (b.batch_id, c["uid"], c["seq"])
            checked += 1
    assert checked > 0


# --- require_log_probs_when_stale --------------------------------------------------------------

def _logp_rows() -> list[dict]:
    return [
        _row([1], [2, 3], mn=4, mx=4, staleness=0, uid="fresh"),                   # on-policy
        _row([1], [2, 3], mn=3, mx=3, staleness=1, uid="old", session=2),          # stale
        _row([1], [2, 3], mn=3, mx=4, staleness=0, uid="mixed", session=1),        # one token old
        _row([1], [2, 3], mn=1, mx=1, staleness=3, logp=[-1.0, -2.0], uid="has"),  # has log-probs
        _row([1], [2], mn=0, mx=0, staleness=4, uid="pad", is_padding=True),        # padding
        _row([1], [], mn=0, mx=0, staleness=4, uid="empty"),                        # no tokens
    ]


def test_stale_rows_without_log_probs_are_refused_by_uid_session_and_staleness() -> None:
    table = _table(_logp_rows())
    msg = (r"require_log_probs_when_stale=True: 2 row\(s\) hold tokens from older weights but no "
           r"rollout_log_probs: uid='old', session_id=2, index=0 \(staleness 1, oldest token 1 "
           r"steps behind\); uid='mixed', session_id=1, index=0 \(staleness 0, oldest token 1 "
           r"steps behind\)\. Have the rollout side")
    for layout in ("padded", "packed"):
        with pytest.raises(StaleWithoutLogProbsError, match=msg):
            batch_to_torch(table, layout, require_log_probs_when_stale=True)
    assert issubclass(StaleWithoutLogProbsError, BatchFormatError)


def test_on_policy_padding_empty_and_logged_rows_pass_and_the_check_is_opt_in() -> None:
    rows = _logp_rows()
    keep = _table([x for x in rows if x["uid"] not in ("old", "mixed")])
    batch_to_torch(keep, "padded", require_log_probs_when_stale=True)
    batch_to_torch(_table(rows), "padded")                 # off by default


def test_more_than_five_refused_rows_are_counted() -> None:
    rows = [_row([1], [2], mn=0, mx=0, staleness=1, uid=f"u{i}") for i in range(7)]
    with pytest.raises(StaleWithoutLogProbsError, match=r"7 row\(s\).*u4.*\(\+2 more\)"):
        batch_to_torch(_table(rows), "padded", require_log_probs_when_stale=True)
