-- name: no_partial_group_in_batch
-- description: audit — batches hold whole groups only. A group selected into a batch must have
--   been terminal before its `select` decision (problem `not terminal`), and every trajectory of
--   its current incarnation in the lake must have arrived before that decision (problem
--   `trajectory after selection`): the live batch is built from the group at that moment, so a
--   later trajectory could not be in it. Trajectories dropped by a re-issue before the
--   selection do not belong to the group.
-- params: none
-- reads: decisions, group_events, trajectories
-- returns: partition, uid, batch_id, problem, select_seq, seq
with
selects as (
    select partition, uid, batch_id, seq as select_seq from decisions where kind = 'select'
),
events as (
    select partition, uid, event, seq from group_events
),
trajs as (
    select partition, uid, seq from trajectories
),

terminal as (
    select partition, uid, min(seq) as term_seq
    from events
    where event in ('finished', 'failure')
    group by partition, uid
),
reissued as (
    select s.partition, s.uid, max(e.seq) as reissued_seq
    from selects as s
    join events as e
        on e.partition = s.partition and e.uid = s.uid and e.event = 'reissued'
        and e.seq < s.select_seq
    group by s.partition, s.uid
),
not_terminal as (
    select s.partition, s.uid, s.batch_id, 'not terminal' as problem, s.select_seq,
           t.term_seq as seq
    from selects as s
    left join terminal as t on t.partition = s.partition and t.uid = s.uid
    where t.term_seq is null or t.term_seq > s.select_seq
),
late_trajectories as (
    select s.partition, s.uid, s.batch_id, 'trajectory after selection' as problem,
           s.select_seq, t.seq
    from selects as s
    join trajs as t on t.partition = s.partition and t.uid = s.uid
    left join reissued as r on r.partition = s.partition and r.uid = s.uid
    where t.seq > s.select_seq and t.seq > coalesce(r.reissued_seq, -1)
),

final as (
    select * from not_terminal
    union all
    select * from late_trajectories
)

select * from final
order by partition, uid, problem, seq nulls first
