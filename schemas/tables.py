"""The pyarrow schemas of every input and lake table (explicit widths: int32 tokens, int64 steps)."""
from __future__ import annotations

import pyarrow as pa

from schemas._fields import field, schema

VERSION_SPAN = pa.struct([
    pa.field("version", pa.int64(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),
])

_PARTITION = "stream name, e.g. `train` or `val`; letters, digits, `-`, `_`, `.` only"
_UID = "prompt-group id, unique within the partition"
_PROMPT_ID = ("dataset id of the prompt the group answers (e.g. verl's dataset index); the same "
              "prompt may be registered as many groups; null = not given")
_DATASET = ("name of the dataset the group's prompt was drawn from (e.g. `math`), which picks "
            "its staleness bound when max_off_policy_threshold maps datasets; null = not given")

# --- what producers hand to ingest (before the buffer adds seq / defaults) -----------------------

GROUPS_INPUT = schema(
    "groups_input", "prompt groups registered as pending by the rollout side",
    field("partition", pa.string(), _PARTITION),
    field("uid", pa.string(), _UID),
    field("global_steps", pa.int64(), "dispatch step of the prompt (integer >= 0)"),
    field("n", pa.int32(), "expected number of sessions (responses); null = unknown", nullable=True),
    field("prompt_id", pa.int64(), _PROMPT_ID, nullable=True),
    field("dataset", pa.string(), _DATASET, nullable=True),
)

STATUS_INPUT = schema(
    "status_input", "status transitions of prompt groups (forward only)",
    field("partition", pa.string(), _PARTITION),
    field("uid", pa.string(), _UID),
    field("status", pa.string(), "one of pending, running, finished, failure"),
)

_TRAJECTORY_FIELDS = [
    field("partition", pa.string(), _PARTITION),
    field("uid", pa.string(), _UID),
    field("session_id", pa.int32(), "response number within the group, 0..n-1"),
    field("index", pa.int32(), "output index within a multi-output agent loop (usually 0)"),
    field("min_global_steps", pa.int64(), "oldest weight version that produced a token"),
    field("max_global_steps", pa.int64(), "newest weight version that produced a token"),
    field("reward", pa.float64(), "scalar reward (sum of token rewards); never NaN; null when "
          "not known: the producer did not send it (the verl adapter's `decisions` mode reads no "
          "rewards), or it was not scored yet", nullable=True),
    field("reward_info", pa.map_(pa.string(), pa.float64()),
          "named reward metrics, e.g. {'acc': 1.0}", nullable=True),
    field("prompt_ids", pa.list_(pa.int32()), "prompt token ids"),
    field("response_ids", pa.list_(pa.int32()), "response token ids"),
    field("response_mask", pa.list_(pa.int8()),
          "loss mask over response tokens (1 = trained on); null = all ones", nullable=True),
    field("rollout_log_probs", pa.list_(pa.float32()),
          "log-probs of the response tokens under the rollout policy; null = unknown",
          nullable=True),
    field("version_spans", pa.list_(VERSION_SPAN),
          "per-token weight versions as runs of (version, n_tokens); null = unknown",
          nullable=True),
    field("is_padding", pa.bool_(), "padding row added downstream (excluded from metrics)"),
    field("versions_inferred", pa.bool_(),
          "min/max_global_steps were not reported and were set to dispatch step - 1 "
          "(verl adapter only)"),
    field("generation_s", pa.float64(),
          "seconds of rollout time spent generating this trajectory (a rollout that generates "
          "many at once divides its wall time among them); null = not recorded", nullable=True),
]

# a producer that keeps the token payload elsewhere sends the response length alone
_STATED_RESPONSE_TOKENS = field(
    "n_response_tokens", pa.int64(),
    "number of response tokens, for a producer that keeps the tokens elsewhere and sends "
    "response_ids empty (the verl adapter: verl's trainer reads them from TransferQueue); "
    "null = the length of response_ids. Given with response_ids, it must equal their length",
    nullable=True)

TRAJECTORIES_INPUT = schema(
    "trajectories_input", "trajectories (one per response) as producers send them",
    *_TRAJECTORY_FIELDS, _STATED_RESPONSE_TOKENS,
)

# --- lake tables ---------------------------------------------------------------------------------

_SEQ = field("seq", pa.int64(), "arrival sequence number, unique and increasing per buffer")
_TS = field("ts", pa.timestamp("us", tz="UTC"), "wall-clock time the buffer accepted the row")

N_RESPONSE_TOKENS = field(
    "n_response_tokens", pa.int64(),
    "number of response tokens, stored at ingest so that queries never read the token payload "
    "for a length: the length of response_ids, or the count a producer sent without them; kept "
    "when retention empties the payload")

TRAJECTORIES = schema(
    "trajectories", "every accepted trajectory, payload included",
    *_TRAJECTORY_FIELDS, N_RESPONSE_TOKENS, _SEQ, _TS,
)

GROUP_EVENTS = schema(
    "group_events", "registration, status transitions and re-issues of prompt groups",
    field("partition", pa.string(), _PARTITION),
    field("uid", pa.string(), _UID),
    field("event", pa.string(),
          "registered | running | finished | failure | reissued"),
    field("global_steps", pa.int64(), "dispatch step (the new one for `reissued`)"),
    field("n", pa.int32(), "expected session count (registration only)", nullable=True),
    field("prompt_id", pa.int64(), _PROMPT_ID + " (registration only)", nullable=True),
    field("dataset", pa.string(), _DATASET + " (registration only)", nullable=True),
    field("kept_rows", pa.int64(),
          "reissued: how many stored trajectories the re-issue kept (`resume` writes them again "
          "right after this event; 0 for `reissue`, which drops them); null on other events or "
          "in a lake written before this column", nullable=True),
    _SEQ, _TS,
)

DECISIONS = schema(
    "decisions", "the decision log: every eviction, selection, discard, refill and release",
    field("partition", pa.string(), _PARTITION),
    field("step", pa.int64(), "trainer global step `g` of the sample call"),
    field("call_id", pa.int64(), "id of the sample / wait call that took the decision"),
    field("poll", pa.int32(), "poll number within the call (0-based)"),
    field("kind", pa.string(), "evict | select | discard | refill | refill_failed | "
          "refill_deferred | release (refill_failed: the refill of the same call and poll "
          "raised; it served nothing; refill_deferred: prompts owed and not asked yet, held back "
          "by admission or while an earlier ask runs; the next refill asks for them)"),
    field("uid", pa.string(), "group concerned; null for refill rows", nullable=True),
    field("reason", pa.string(),
          "evict: stale | zero_variance | failure; select: stale when the group was trained "
          "masked (max_off_policy_strategy='mask'), else null; refill, refill_deferred: the "
          "refill policy (refill_deferred: reissue for the prompts of an ask no group "
          "registered before a restart, owed again by reissue/resume); "
          "refill_failed: the type of the exception refill_fn raised",
          nullable=True),
    field("group_span", pa.int64(), "group span g - global_steps + 1 at the decision",
          nullable=True),
    field("value", pa.float64(), "zero_variance: the group's single metric value",
          nullable=True),
    field("batch_id", pa.int64(), "select / release: the batch", nullable=True),
    field("count", pa.int64(), "refill: number of prompts requested; refill_deferred: number "
          "held back (all of them, not only this poll's); else 1"),
    field("replaces", pa.list_(pa.string()),
          "refill: uids of the evicted groups (same partition) whose replacement this refill "
          "asks for, in eviction order (refill_failed: those of the failed ask; "
          "refill_deferred: those held back); null on other kinds", nullable=True),
    field("bound", pa.int64(),
          "select: the staleness bound in force for the group, the largest group span it may be "
          "trained at (the `drop` rule's threshold, the `wait` gate's, or the `mask` threshold "
          "a masked group is over); null = unbounded, on "
          "other kinds, or a lake written before this column", nullable=True),
    field("strategy", pa.string(),
          "select: the max_off_policy_strategy that set `bound` (drop | wait | admit | mask); "
          "null when "
          "`bound` is", nullable=True),
    field("request", pa.string(),
          "select: the key the `sample` call was named with (`sample(request=...)`; the Ray "
          "client names every call), so that the call sent again after its reply was lost gets "
          "this batch back; null when the call named none, on other kinds, or in a lake "
          "written before this column", nullable=True),
    _SEQ, _TS,
)

METRICS = schema(
    "metrics", "per-step metric rows (eviction and off-policy metrics)",
    field("partition", pa.string(), _PARTITION),
    field("step", pa.int64(), "trainer global step"),
    field("batch_id", pa.int64(), "batch the metric belongs to; null: an eviction metric a "
          "`wait_for_sampleable` reported (those evictions are not reported again by a batch)",
          nullable=True),
    field("name", pa.string(), "metric key, e.g. training/off_policy/evicted_samples"),
    field("value", pa.float64(), "metric value"),
    _SEQ, _TS,
)

BATCH_PROVENANCE = schema(
    "batch_provenance", "provenance columns a Batch carries beside the trajectory payload",
    field("batch_id", pa.int64(), "id of the batch"),
    field("step", pa.int64(), "trainer global step `g` the batch was sampled at"),
    field("global_steps", pa.int64(), "the group's dispatch step"),
    field("status", pa.string(), "the group's terminal status (finished | failure)"),
    field("span", pa.int64(), "max_global_steps - min_global_steps + 1"),
    field("staleness", pa.int64(), "(g - 1) - max_global_steps"),
    field("staleness_worst", pa.int64(), "(g - 1) - min_global_steps"),
    field("group_span", pa.int64(), "g - global_steps + 1"),
    field("times_sampled", pa.int32(), "how often the group was handed out (always 1)"),
    field("is_stale", pa.bool_(), "max_off_policy_strategy='mask': the group was over the "
          "staleness bound and is trained with its loss switched off (`to_torch`'s loss_mask "
          "zeroes the row); always false under the other strategies"),
)

# --- what the rules read (declared once; the live buffer and the lake build the same rows) -------

GROUP_TRAJECTORIES = schema(
    "group_trajectories", "per-trajectory inputs of the group aggregates",
    field("partition", pa.string(), _PARTITION),
    field("uid", pa.string(), _UID),
    field("metric", pa.float64(), "the filter metric of the trajectory (reward sum or named "
          "reward metric); null when it lacks it or no filter is configured", nullable=True),
    field("n_response_tokens", pa.int64(), "number of response tokens"),
    field("min_global_steps", pa.int64(), "oldest weight version that produced a token"),
    field("max_global_steps", pa.int64(), "newest weight version that produced a token"),
)

CANDIDATES = schema(
    "candidates", "terminal groups a poll decides over, with the aggregates every rule reads",
    field("partition", pa.string(), _PARTITION),
    field("uid", pa.string(), _UID),
    field("global_steps", pa.int64(), "dispatch step"),
    field("term_seq", pa.int64(), "arrival seq of the terminal status (tie-break after "
          "global_steps)"),
    field("status", pa.string(), "finished | failure (a finished group without trajectories "
          "is a failure)"),
    field("n_traj", pa.int64(), "trajectories of the group"),
    field("metric_min", pa.float64(), "smallest filter-metric value", nullable=True),
    field("metric_max", pa.float64(), "largest filter-metric value", nullable=True),
    field("metric_nulls", pa.int64(), "trajectories lacking the filter metric"),
    field("response_tokens_sum", pa.int64(), "response tokens of all trajectories",
          nullable=True),
    field("response_tokens_min", pa.int64(), "shortest response", nullable=True),
    field("response_tokens_max", pa.int64(), "longest response", nullable=True),
    field("min_version", pa.int64(), "oldest weight version of any trajectory", nullable=True),
    field("max_version", pa.int64(), "newest weight version of any trajectory", nullable=True),
    field("dataset", pa.string(), _DATASET, nullable=True),
)

STALE_BOUNDS = schema(
    "stale_bounds", "per-dataset staleness bounds the `stale` rule joins on the group's dataset "
    "(from a max_off_policy_threshold mapping; a dataset not listed takes the default bound)",
    field("dataset", pa.string(), "dataset name, as groups register it"),
    field("bound", pa.int64(), "largest group span a group of that dataset may be trained at"),
)

LOOKUPS = {"stale_bounds": STALE_BOUNDS}
"""Relations a rule may join on one candidate column (its `lookup` header), by name."""

LAKE_TABLES = {
    "trajectories": TRAJECTORIES,
    "group_events": GROUP_EVENTS,
    "decisions": DECISIONS,
    "metrics": METRICS,
}
