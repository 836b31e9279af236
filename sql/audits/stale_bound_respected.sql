-- name: stale_bound_respected
-- description: audit — under `drop` with threshold T no group is selected with group span
--   step - global_steps + 1 > T: a group that old must have been evicted instead. The group span
--   is taken from the `select` row and also recomputed from the group's dispatch step at that
--   moment, so a wrongly logged span is caught too. Validation partitions (`val`) are exempt.
--   `strategy` is the one recorded with the selection: under `wait` or `mask` a group over T
--   is that strategy's design, which `replaylake audit` counts apart rather than failing.
-- params: threshold BIGINT >= 1
-- reads: decisions, group_events
-- returns: partition, uid, batch_id, step, group_span, recomputed_group_span, strategy
with
selects as (
    select partition, uid, batch_id, step, group_span, seq, strategy
    from decisions
    where kind = 'select' and partition <> 'val'
),
events as (
    select partition, uid, event, global_steps, seq from group_events
),

dispatch_at_select as (
    select s.partition, s.uid, s.seq, arg_max(e.global_steps, e.seq) as global_steps
    from selects as s
    join events as e
        on e.partition = s.partition and e.uid = s.uid and e.seq < s.seq
        and e.event in ('registered', 'reissued')
    group by s.partition, s.uid, s.seq
),
spans as (
    select s.partition, s.uid, s.batch_id, s.step, s.group_span,
           s.step - d.global_steps + 1 as recomputed_group_span, s.strategy
    from selects as s
    left join dispatch_at_select as d
        on d.partition = s.partition and d.uid = s.uid and d.seq = s.seq
),

final as (
    select * from spans
    where group_span > $threshold or recomputed_group_span > $threshold
)

select * from final
order by partition, step, batch_id, uid
