-- name: provenance
-- description: the provenance of every trained row, and the one place its formulas live:
--   span (weight versions that produced it), staleness at the training step g, (g - 1) - newest
--   version, worst staleness (g - 1) - oldest version, the group span g - dispatch step + 1, and
--   the per-token staleness sum (in 128 bits, exact for every step below the ingest limit 2**62)
--   and maximum from the row's version spans. The live buffer compiles
--   these expressions for every batch; the lake runs the file over `batch_rows`.
-- params: none
-- reads: batch_rows
-- returns: partition, step, batch_id, uid, seq, global_steps, min_global_steps, max_global_steps,
--   is_padding, n_response_tokens, span_tokens, span, staleness, staleness_worst, group_span,
--   token_staleness_sum, token_staleness_max
select
    partition,
    step,
    batch_id,
    uid,
    seq,
    global_steps,
    min_global_steps,
    max_global_steps,
    is_padding,
    n_response_tokens,
    span_tokens,
    max_global_steps - min_global_steps + 1 as span,
    (step - 1) - max_global_steps as staleness,
    (step - 1) - min_global_steps as staleness_worst,
    step - global_steps + 1 as group_span,
    (step - 1)::hugeint * span_tokens - span_version_sum as token_staleness_sum,
    (step - 1) - span_version_min as token_staleness_max
from batch_rows
order by partition, step, batch_id, seq
