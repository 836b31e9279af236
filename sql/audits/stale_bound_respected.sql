-- name: stale_bound_respected
-- description: audit — under `drop` (and `admit`) no group is selected with group span
--   step - global_steps + 1 above its bound: a group that old must have been evicted instead. A
--   group's bound is its dataset's in `stale_bounds` (a max_off_policy_threshold mapping, the
--   dataset as the group registered it), else `threshold` (the mapping's "*" default, or the one
--   bound), as the `stale` rule decides; with `stale_bounds` empty every group is held to
--   `threshold`. The group span is taken from the `select` row and also recomputed from the
--   group's dispatch step at that moment, so a wrongly logged span is caught too. Validation
--   partitions (`val`) are exempt. `strategy` is the one recorded with the selection: under
--   `wait` or `mask` a group over its bound is that strategy's design, which `replaylake audit`
--   counts apart rather than failing.
-- params: threshold BIGINT >= 1
-- reads: decisions, group_events, stale_bounds
-- returns: partition, uid, batch_id, step, dataset, bound, group_span, recomputed_group_span,
--   strategy
with
selects as (
    select partition, uid, batch_id, step, group_span, seq, strategy
    from decisions
    where kind = 'select' and partition <> 'val'
),
events as (
    select partition, uid, event, global_steps, dataset, seq from group_events
),

dispatch_at_select as (
    -- the group's dispatch step (a re-issue's, if any) and the dataset it registered with
    select s.partition, s.uid, s.seq, arg_max(e.global_steps, e.seq) as global_steps,
           arg_max(e.dataset, e.seq) filter (where e.event = 'registered') as dataset
    from selects as s
    join events as e
        on e.partition = s.partition and e.uid = s.uid and e.seq < s.seq
        and e.event in ('registered', 'reissued')
    group by s.partition, s.uid, s.seq
),
spans as (
    select s.partition, s.uid, s.batch_id, s.step, d.dataset,
           coalesce(b.bound, $threshold) as bound, s.group_span,
           s.step - d.global_steps + 1 as recomputed_group_span, s.strategy
    from selects as s
    left join dispatch_at_select as d
        on d.partition = s.partition and d.uid = s.uid and d.seq = s.seq
    left join stale_bounds as b on b.dataset = d.dataset
),

final as (
    select * from spans
    where group_span > bound or recomputed_group_span > bound
)

select * from final
order by partition, step, batch_id, uid
