-- name: occupancy_by_step
-- description: buffer occupancy over the run: at the end of every trainer step (everything the
--   lake recorded before the first decision of a later step, the cut `state_as_of` uses), how
--   many groups of each partition were still in the buffer (registered, not yet selected,
--   evicted or discarded), per last status: pending, running, finished, failure. A step with
--   no group of a status has no row for it.
-- params: none
-- reads: group_events, decisions
-- returns: partition, step, status, n_groups
with
events as (
    select
        partition, uid, event, seq,
        lead(seq) over (partition by partition, uid order by seq) as next_seq
    from group_events
),
decs as (
    select partition, uid, kind, step, seq from decisions where kind <> 'release'
),

step_starts as (
    select step, min(seq) as first_seq from decs group by step
),
-- the end of step s: the first decision of any later step (the whole lake for the last step)
cutoffs as (
    select
        step,
        coalesce(min(first_seq) over (
            order by step rows between 1 following and unbounded following),
            9223372036854775807) as cut
    from step_starts
),
removed as (
    select partition, uid, min(seq) as out_seq
    from decs
    where kind in ('select', 'evict', 'discard') and uid is not null
    group by partition, uid
),
at_step as (
    select
        e.partition, c.step, e.uid,
        case when e.event in ('registered', 'reissued') then 'pending' else e.event end as status
    from events as e
    join cutoffs as c on e.seq < c.cut and (e.next_seq is null or e.next_seq >= c.cut)
    left join removed as r on r.partition = e.partition and r.uid = e.uid
    where r.out_seq is null or r.out_seq >= c.cut
),

final as (
    select partition, step, status, count(*) as n_groups
    from at_step
    group by partition, step, status
)

select * from final
order by partition, step,
    case status when 'pending' then 0 when 'running' then 1 when 'finished' then 2 else 3 end
