"""Per-token weight versions and staleness for the trainer's tensors, and the check that stale rows
carry their behaviour log-probs.

Why per token: a response generated while the weights changed holds tokens from two or more
versions, and a staleness-aware loss (truncated importance sampling, M2PO) weighs each token by
how old the weights behind it were. Where the row reported ``version_spans`` (runs of
(version, n_tokens) over its response), every token gets its own version. Without spans only the
row's range is known: when ``min_global_steps == max_global_steps`` that is every token's version
exactly; when it is a range, every token gets ``min_global_steps``, the oldest version that can
have produced it (the worst case: its staleness is never under-stated).

A token's staleness is ``(g - 1) - version``, g the trainer step (the newest weights at step g are
version g - 1), the formula of the row's ``staleness`` in sql/metrics/provenance.sql; g - 1 is
read per row as ``staleness + max_global_steps``, so no column beyond a Batch's is needed.
Positions that hold no response token (prompt, padding) are 0 in both tensors, as they are in
``response_mask`` and ``rollout_log_probs``: read them where the response is.

numpy only (no torch): the caller hands in numpy views of its output tensors.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.to_torch.ragged import BatchFormatError, describe_rows

VERSIONS, STALENESS = "token_versions", "token_staleness"
RESPONSES = ("responses_token_versions", "responses_token_staleness")
_SHOWN = 5


class StaleWithoutLogProbsError(BatchFormatError):
    """`require_log_probs_when_stale=True` and a row with stale tokens has no rollout log-probs."""


def _ints(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        isnull = col.is_null().to_numpy(zero_copy_only=False)
        raise BatchFormatError(f"column {name!r} is null in {describe_rows(isnull)}; "
                               "it must not be")
    return col.to_numpy().astype(np.int64, copy=False)


def _response_runs(table: pa.Table, r: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of one version over the response tokens, row after row: (row, version,
    n_tokens) int64 arrays. A row with version spans has its spans; any other row one run of
    ``min_global_steps`` over its whole response (``r``: the response lengths)."""
    rows = np.arange(len(r), dtype=np.int64)
    lo = _ints(table, "min_global_steps")
    if "version_spans" not in table.column_names or \
            table.column("version_spans").null_count == table.num_rows:
        return rows, lo, r
    spans = table.column("version_spans").combine_chunks()
    has = spans.is_valid().to_numpy(zero_copy_only=False)
    counts = pc.fill_null(pc.list_value_length(spans), 0).to_numpy().astype(np.int64)
    flat = spans.flatten()                     # skips null rows and honours slicing
    ver = flat.field("version").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    n_tok = flat.field("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    parents = np.repeat(rows, counts)
    covered = np.bincount(parents, weights=n_tok, minlength=len(r)).astype(np.int64)
    bad = has & (covered != r)
    bad[parents[n_tok < 0]] = True
    if bad.any():
        raise BatchFormatError(
            f"column 'version_spans': in {describe_rows(bad)} the n_tokens do not add up to the "
            "response length (or are negative); token versions need spans that cover the "
            "response exactly, or none (null)")
    plain = np.flatnonzero(~has)
    row = np.concatenate([parents, plain])
    order = np.argsort(row, kind="stable")          # spans keep their order within a row
    return (row[order], np.concatenate([ver, lo[plain]])[order],
            np.concatenate([n_tok, r[plain]])[order])


def build(table: pa.Table, layout: str, p: np.ndarray, r: np.ndarray) -> dict[str, np.ndarray]:
    """The version and staleness tensors of ``layout`` as numpy arrays (int64): ``token_*``
    [B, L] (padded) or [T] (packed), and ``responses_token_*`` [B, R] (padded).

    Each is one ``np.repeat`` of runs in memory order -- per row: its prompt (0), its version
    runs, its padding (0) -- so every output element is written once, with no intermediate
    stream and no mask."""
    row, ver, n_tok = _response_runs(table, r)
    newest = _ints(table, "staleness") + _ints(table, "max_global_steps")     # g - 1, per row
    stale = newest[row] - ver
    n = p + r
    B = len(n)
    if layout == "padded":
        L, R = int(n.max(initial=0)), int(r.max(initial=0))
        token = _laid_out(row, n_tok, B, p, L - n)
        resp = _laid_out(row, n_tok, B, np.zeros(B, np.int64), R - r)
        return {VERSIONS: token(ver).reshape(B, L), STALENESS: token(stale).reshape(B, L),
                RESPONSES[0]: resp(ver).reshape(B, R), RESPONSES[1]: resp(stale).reshape(B, R)}
    token = _laid_out(row, n_tok, B, p, np.zeros(B, np.int64))
    return {VERSIONS: token(ver), STALENESS: token(stale)}


def _laid_out(row: np.ndarray, n_tok: np.ndarray, B: int, before: np.ndarray,
              after: np.ndarray) -> Any:
    """A function of per-run values giving the flat output: row i is ``before[i]`` zeros, its
    runs, then ``after[i]`` zeros. The run order and lengths are computed once for both."""
    if len(row) == B and (row == np.arange(B)).all():      # one run per row: interleave
        lengths = np.stack([before, n_tok, after], axis=1).reshape(-1)

        def values(v: np.ndarray) -> np.ndarray:
            z = np.zeros(B, np.int64)
            return np.repeat(np.stack([z, v, z], axis=1).reshape(-1), lengths)
        return values
    # several runs per row: the row's zero runs around them, ordered by (row, place)
    key = np.concatenate([np.arange(B) * 3, row * 3 + 1, np.arange(B) * 3 + 2])
    order = np.argsort(key, kind="stable")
    lengths = np.concatenate([before, n_tok, after])[order]
    zeros = np.zeros(B, np.int64)

    def values(v: np.ndarray) -> np.ndarray:
        return np.repeat(np.concatenate([zeros, v, zeros])[order], lengths)
    return values


def refuse_stale_without_log_probs(table: pa.Table, r: np.ndarray) -> None:
    """Raise naming every trained row (not padding, with response tokens) that holds a token
    older than the trainer's weights (``(g - 1) - min_global_steps > 0``) and no
    ``rollout_log_probs``: an importance ratio needs the behaviour policy's log-probs."""
    logp = table.column("rollout_log_probs")
    if logp.null_count == 0:
        return
    missing = logp.is_null().to_numpy(zero_copy_only=False)
    worst = (_ints(table, "staleness") + _ints(table, "max_global_steps")
             - _ints(table, "min_global_steps"))
    padding = table.column("is_padding").to_numpy(zero_copy_only=False).astype(bool)
    bad = np.flatnonzero(missing & (worst > 0) & ~padding & (r > 0))
    if bad.size == 0:
        return
    keys = [c for c in ("uid", "session_id", "index") if c in table.column_names]
    shown = table.take(bad[:_SHOWN]).select(keys).to_pylist()
    stale = _ints(table, "staleness")
    rows = "; ".join(
        ", ".join(f"{k}={row[k]!r}" for k in keys)
        + f" (staleness {stale[i]}, oldest token {worst[i]} steps behind)"
        for i, row in zip(bad[:_SHOWN].tolist(), shown))
    more = f" (+{bad.size - _SHOWN} more)" if bad.size > _SHOWN else ""
    raise StaleWithoutLogProbsError(
        f"require_log_probs_when_stale=True: {bad.size} row(s) hold tokens from older weights "
        f"but no rollout_log_probs: {rows}{more}. Have the rollout side report the log-probs "
        "of its tokens, recompute them before the loss, or pass "
        "require_log_probs_when_stale=False")
