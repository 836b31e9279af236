-- name: certificates
-- description: the staleness certificate of every batch, one row per trajectory it trained:
--   the bound in force when its group was selected (recorded with the `select` decision: the
--   largest group span allowed, null = unbounded or a lake written before it was recorded;
--   under per-dataset bounds the group's own: its dataset's, else the mapping's default) and
--   the strategy that set it, the versions that produced the row (min / max global steps; with
--   version spans, span_tokens = the tokens whose version is known and token_staleness_max = the
--   staleness of its oldest token), its staleness at the step, the group span, and over_bound:
--   the group was trained at a group span above its bound. The live buffer compiles the items of
--   `certified` for `batch.certificate`; the lake runs this file.
-- params: none
-- reads: decisions, provenance
-- returns: partition, step, batch_id, uid, seq, is_padding, bound, strategy, global_steps,
--   min_global_steps, max_global_steps, staleness, staleness_worst, group_span,
--   n_response_tokens, span_tokens, token_staleness_max, over_bound
with
selects as (
    select partition, batch_id, uid, bound, strategy
    from decisions
    where kind = 'select'
),
trained as (
    select partition, step, batch_id, uid, seq, is_padding, global_steps, min_global_steps,
           max_global_steps, staleness, staleness_worst, group_span, n_response_tokens,
           span_tokens, token_staleness_max
    from provenance
),

bound_rows as (
    select t.*, s.bound, s.strategy
    from trained as t
    join selects as s
        on s.partition = t.partition and s.batch_id = t.batch_id and s.uid = t.uid
),
certified as (
    select
        partition, step, batch_id, uid, seq, is_padding, bound, strategy, global_steps,
        min_global_steps, max_global_steps, staleness, staleness_worst, group_span,
        n_response_tokens, span_tokens, token_staleness_max,
        coalesce(group_span > bound, false) as over_bound
    from bound_rows
)

select * from certified
order by partition, step, batch_id, seq
