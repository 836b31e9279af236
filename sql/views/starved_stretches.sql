-- name: starved_stretches
-- description: every stretch of consecutive steps in which a dataset had groups in flight but
--   no trained row: the starvation signal's history (`starvation_steps` names a dataset once a
--   stretch reaches that length; filter on `length` for the same cut). One observation per
--   partition and step, at its first batch: a dataset is starved at that step when one of its
--   groups was registered before the batch's selection and was neither terminal nor removed by
--   then, and the batch holds no trajectory of it. Consecutive means consecutive observed steps
--   (the steps that chose a batch); groups without a dataset are not counted.
-- params: none
-- reads: decisions, group_events, batch_rows
-- returns: partition, dataset, first_step, last_step, length
with
selects as (
    select partition, step, batch_id, seq from decisions where kind = 'select'
),
removals as (
    select partition, uid, seq from decisions where kind in ('evict', 'discard')
),
events as (
    select partition, uid, event, dataset, seq from group_events
),
trained_rows as (
    select partition, step, batch_id, dataset from batch_rows where dataset is not null
),

-- the first batch of each step, and its place among the partition's observed steps
observed as (
    select
        partition, step, arg_min(batch_id, seq) as batch_id, min(seq) as select_seq,
        row_number() over (partition by partition order by step) as k
    from selects
    group by partition, step
),
registered as (
    select partition, uid, dataset, seq as reg_seq
    from events
    where event = 'registered' and dataset is not null
),
ended as (
    select partition, uid, min(seq) as end_seq
    from (
        select partition, uid, seq from events where event in ('finished', 'failure')
        union all
        select partition, uid, seq from removals
    )
    group by partition, uid
),
in_flight as (
    select distinct o.partition, o.step, o.k, r.dataset, o.batch_id
    from observed as o
    join registered as r on r.partition = o.partition and r.reg_seq < o.select_seq
    left join ended as e on e.partition = r.partition and e.uid = r.uid
    where e.end_seq is null or e.end_seq > o.select_seq
),
starved as (
    select i.partition, i.dataset, i.step, i.k
    from in_flight as i
    where not exists (
        select 1 from trained_rows as t
        where t.partition = i.partition and t.step = i.step and t.batch_id = i.batch_id
          and t.dataset = i.dataset)
),
islands as (
    select
        partition, dataset, step,
        k - row_number() over (partition by partition, dataset order by k) as island
    from starved
),

final as (
    select
        partition, dataset, min(step) as first_step, max(step) as last_step,
        count(*)::bigint as length
    from islands
    group by partition, dataset, island
)

select partition, dataset, first_step, last_step, length from final
order by partition, first_step, dataset
