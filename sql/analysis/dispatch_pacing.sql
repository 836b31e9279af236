-- name: dispatch_pacing
-- description: admission pacing over a run: per partition and trainer step g, the dispatch
--   capacity at the start of the step (the capacity of sql/policies/dispatch_capacity.sql, the
--   same expression, over the lake's state just before the step's first dispatch or first
--   decision, whichever came first) beside what the step actually dispatched (groups
--   registered with global_steps = g). Every group removed by an eviction or a discard frees
--   a place (n_removed: during the step), so a run paced by admission has n_dispatched <=
--   capacity + n_removed at every step: n_over is what a step dispatched beyond that (0 under
--   `admit`; under `drop`, groups that risked going stale). A step ends where the next one
--   starts. As the live count does, a group a rule evicts for what it holds (zero variance,
--   failure, ...) frees its place when it lands, not when the next poll evicts it; a stale,
--   vanished or discarded group frees it when it is removed (a group stale at the start still
--   counts there, and its eviction is in n_removed). The lake knows a group was doomed only
--   from its eviction, so the run's last step can show n_over > 0 for groups that landed
--   doomed after the last poll and were never evicted (the run ended first).
-- params: threshold BIGINT, batch_size BIGINT
-- reads: group_events, decisions
-- returns: partition, step, n_selected, n_sampleable, n_inflight, capacity, n_removed,
--   n_dispatched, n_over
with
events as (
    select
        partition, uid, event, global_steps, seq,
        lead(seq) over (partition by partition, uid order by seq) as next_seq
    from group_events
),
decs as (
    select partition, uid, kind, step, seq from decisions where kind <> 'release'
),

-- a step starts with its first decision or its first registration, whichever is first
starts as (
    select partition, step, min(seq) as start_seq
    from (
        select partition, step, seq from decs
        union all
        select partition, global_steps as step, seq from events where event = 'registered'
    )
    group by partition, step
),
windows as (
    select
        partition, step, start_seq,
        coalesce(lead(start_seq) over (partition by partition order by step),
                 9223372036854775807) as end_seq
    from starts
),
removed as (
    select partition, uid, min(seq) as out_seq
    from decs
    where kind in ('select', 'evict', 'discard') and uid is not null
    group by partition, uid
),
-- a group a rule evicts for what it holds (zero variance, failure, ...) is doomed from the
-- moment it lands (the live count leaves it out from then on); a stale, vanished or discarded
-- group frees its place when it is removed
freeing as (
    select
        d.partition, d.uid, min(d.seq) as out_seq,
        bool_or(d.kind = 'evict' and d.reason not in ('stale', 'vanished')) as doomed
    from decisions as d
    where d.kind in ('evict', 'discard') and d.uid is not null
    group by d.partition, d.uid
),
landed as (
    select partition, uid, min(seq) as term_seq
    from events
    where event in ('finished', 'failure')
    group by partition, uid
),
frees as (
    select
        f.partition, f.uid,
        case when f.doomed then coalesce(l.term_seq, f.out_seq) else f.out_seq end as free_seq
    from freeing as f
    left join landed as l on l.partition = f.partition and l.uid = f.uid
),
-- each group's last event before the start, if it was still in the buffer then and not doomed
waiting as (
    select
        w.partition, w.step,
        count(*) filter (where e.event in ('registered', 'reissued', 'running')) as n_inflight,
        count(*) filter (where e.event in ('finished', 'failure')) as n_sampleable
    from windows as w
    join events as e
        on e.partition = w.partition and e.seq < w.start_seq
        and (e.next_seq is null or e.next_seq >= w.start_seq)
    left join removed as r on r.partition = e.partition and r.uid = e.uid
    left join frees as x on x.partition = e.partition and x.uid = e.uid
    where (r.out_seq is null or r.out_seq >= w.start_seq)
        and (x.free_seq is null or x.free_seq >= w.start_seq)
    group by w.partition, w.step
),
taken as (
    select w.partition, w.step, count(d.uid) as n_selected
    from windows as w
    left join decs as d
        on d.partition = w.partition and d.kind = 'select' and d.step >= w.step
        and d.seq < w.start_seq
    group by w.partition, w.step
),
freed as (
    select w.partition, w.step, count(x.uid) as n_removed
    from windows as w
    left join frees as x
        on x.partition = w.partition and x.free_seq >= w.start_seq and x.free_seq < w.end_seq
    group by w.partition, w.step
),
sent as (
    select w.partition, w.step, count(e.uid) as n_dispatched
    from windows as w
    left join events as e
        on e.partition = w.partition and e.event = 'registered' and e.global_steps = w.step
    group by w.partition, w.step
),

counted as (
    select
        w.partition, w.step, t.n_selected,
        coalesce(q.n_sampleable, 0) as n_sampleable,
        coalesce(q.n_inflight, 0) as n_inflight,
        f.n_removed, s.n_dispatched
    from windows as w
    join taken as t on t.partition = w.partition and t.step = w.step
    join freed as f on f.partition = w.partition and f.step = w.step
    join sent as s on s.partition = w.partition and s.step = w.step
    left join waiting as q on q.partition = w.partition and q.step = w.step
),
paced as (
    select
        partition, step, n_selected, n_sampleable, n_inflight,
        greatest($threshold * $batch_size - n_selected - n_sampleable - n_inflight, 0)
            as capacity,
        n_removed, n_dispatched
    from counted
),

final as (
    select
        partition, step, n_selected, n_sampleable, n_inflight, capacity, n_removed,
        n_dispatched, greatest(n_dispatched - capacity - n_removed, 0) as n_over
    from paced
)

select * from final
order by partition, step
