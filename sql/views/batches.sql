-- name: batches
-- description: one row per batch handed out: step, call, group and trajectory counts, the
--   trajectory staleness at the step it was sampled (non-padding rows, from the `provenance`
--   view), the largest group span logged with its selections, and the staleness bound recorded
--   with them (bound: the largest group span allowed, null = unbounded or not recorded; under
--   per-dataset bounds each selection records its group's own and this is the loosest of them;
--   strategy: what set it; see the `certificates` view)
-- params: none
-- reads: decisions, provenance
-- returns: partition, batch_id, step, call_id, n_groups, n_trajectories, n_padding,
--   staleness_mean, staleness_max, staleness_min, group_span_max, released, select_seq, bound,
--   strategy
with
selects as (
    select partition, batch_id, step, call_id, group_span, seq, bound, strategy
    from decisions
    where kind = 'select'
),
releases as (
    select distinct partition, batch_id from decisions where kind = 'release'
),
rows_trained as (
    select partition, batch_id, is_padding, staleness from provenance
),

per_batch as (
    select
        partition, batch_id,
        min(step) as step,
        min(call_id) as call_id,
        count(*) as n_groups,
        max(group_span) as group_span_max,
        min(seq) as select_seq,
        max(bound) as bound,
        min(strategy) as strategy
    from selects
    group by partition, batch_id
),
per_rows as (
    select
        partition, batch_id,
        count(*) as n_trajectories,
        count(*) filter (where is_padding) as n_padding,
        avg(staleness) filter (where not is_padding) as staleness_mean,
        max(staleness) filter (where not is_padding) as staleness_max,
        min(staleness) filter (where not is_padding) as staleness_min
    from rows_trained
    group by partition, batch_id
),

final as (
    select
        b.partition, b.batch_id, b.step, b.call_id, b.n_groups,
        coalesce(r.n_trajectories, 0) as n_trajectories,
        coalesce(r.n_padding, 0) as n_padding,
        r.staleness_mean, r.staleness_max, r.staleness_min,
        b.group_span_max,
        rel.batch_id is not null as released,
        b.select_seq,
        b.bound,
        b.strategy
    from per_batch as b
    left join per_rows as r on r.partition = b.partition and r.batch_id = b.batch_id
    left join releases as rel on rel.partition = b.partition and rel.batch_id = b.batch_id
)

select * from final
order by select_seq, partition, batch_id
