-- name: no_trajectory_after_terminal
-- description: audit — no trajectory of a group arrives after the group's terminal status
--   (finished / failure): a group turns terminal only once all its sessions settled, and a
--   late trajectory must be rejected, not joined to a group that may already be sampled.
-- params: none
-- reads: group_events, trajectories
-- returns: partition, uid, session_id, index, seq, term_seq
with
terminal as (
    select partition, uid, min(seq) as term_seq
    from group_events
    where event in ('finished', 'failure')
    group by partition, uid
),
trajs as (
    select partition, uid, session_id, index, seq from trajectories
),

final as (
    select t.partition, t.uid, t.session_id, t.index, t.seq, g.term_seq
    from trajs as t
    join terminal as g on g.partition = t.partition and g.uid = t.uid
    where t.seq > g.term_seq
)

select * from final
order by partition, uid, seq
