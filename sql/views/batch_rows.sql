-- name: batch_rows
-- description: the inputs of the provenance formulas over the lake: one row per trajectory of
--   every group selected into a batch, as the batch held it (the group's current incarnation,
--   rows that arrived before the selection), with the step of the selection, the group's dispatch
--   step at that moment, the response length and the row's version-span sums: span_tokens (tokens
--   covered), span_version_sum (sum of n_tokens * version, in 128 bits: a 64-bit sum overflows
--   for versions near the step limit) and span_version_min (oldest version that produced a
--   token), all null when the row reported no version spans. The response length
--   is the count stored at ingest, so the token payload is never read; prompt_id and dataset are the group's.
-- params: none
-- reads: decisions, group_events, trajectories
-- returns: partition, step, batch_id, uid, global_steps, min_global_steps, max_global_steps,
--   is_padding, n_response_tokens, span_tokens, span_version_sum, span_version_min, seq,
--   prompt_id, dataset
with
selects as (
    select partition, uid, step, batch_id, seq as select_seq
    from decisions
    where kind = 'select'
),
dispatches as (
    select partition, uid, event, global_steps, prompt_id, dataset, seq
    from group_events
    where event in ('registered', 'reissued')
),
trajs as (
    select partition, uid, seq, min_global_steps, max_global_steps, is_padding, n_response_tokens,
           version_spans
    from trajectories
),

at_select as (
    select
        s.partition, s.uid, s.select_seq,
        arg_max(d.global_steps, d.seq) as global_steps,
        max(d.seq) filter (where d.event = 'reissued') as reissued_seq,
        max(d.prompt_id) filter (where d.event = 'registered') as prompt_id,
        max(d.dataset) filter (where d.event = 'registered') as dataset
    from selects as s
    join dispatches as d
        on d.partition = s.partition and d.uid = s.uid and d.seq < s.select_seq
    group by s.partition, s.uid, s.select_seq
),
rows_of as (
    select
        s.partition,
        s.step,
        s.batch_id,
        s.uid,
        a.global_steps,
        t.min_global_steps,
        t.max_global_steps,
        t.is_padding,
        t.n_response_tokens::bigint as n_response_tokens,
        t.version_spans,
        t.seq,
        a.prompt_id,
        a.dataset
    from selects as s
    join at_select as a
        on a.partition = s.partition and a.uid = s.uid and a.select_seq = s.select_seq
    join trajs as t
        on t.partition = s.partition and t.uid = s.uid
        and t.seq > coalesce(a.reissued_seq, -1) and t.seq < s.select_seq
),

final as (
    select
        partition, step, batch_id, uid, global_steps, min_global_steps, max_global_steps,
        is_padding, n_response_tokens,
        case when version_spans is not null then coalesce(list_sum(
            list_transform(version_spans, lambda s: s.n_tokens::bigint)), 0)::bigint
        end as span_tokens,
        case when version_spans is not null then coalesce(list_sum(
            list_transform(version_spans, lambda s: s.n_tokens::hugeint * s.version)), 0)::hugeint
        end as span_version_sum,
        list_min(list_transform(
            list_filter(version_spans, lambda s: s.n_tokens > 0), lambda s: s.version))::bigint
            as span_version_min,
        seq,
        prompt_id,
        dataset
    from rows_of
)

select * from final
order by partition, step, batch_id, seq
