-- name: no_trajectory_twice
-- description: audit — exactly once into the lake: no (partition, uid, session_id, index) twice
--   among the trajectories of one incarnation of a group. An incarnation runs from the group's
--   registration, or from a re-issue, to the next re-issue: a re-issue drops the trajectories
--   before it, so the same sessions rightly arrive again after one. Ingest refuses a key the
--   group holds already, in the same call or stored, and a restart restores the keys, so a
--   repeat means one write was accepted twice (a retried call whose first try had in fact been
--   written, say). `incarnation_seq` is the seq of the event the incarnation began with (null:
--   the group was never registered).
-- params: none
-- reads: group_events, trajectories
-- returns: partition, uid, session_id, index, incarnation_seq, n_copies, seqs
with
starts as (
    select partition, uid, seq from group_events where event in ('registered', 'reissued')
),
trajs as (
    select partition, uid, session_id, index, seq from trajectories
),

placed as (
    select t.partition, t.uid, t.session_id, t.index, t.seq, max(s.seq) as incarnation_seq
    from trajs as t
    left join starts as s on s.partition = t.partition and s.uid = t.uid and s.seq < t.seq
    group by t.partition, t.uid, t.session_id, t.index, t.seq
),

final as (
    select partition, uid, session_id, index, incarnation_seq, count(*) as n_copies,
           list(seq order by seq) as seqs
    from placed
    group by partition, uid, session_id, index, incarnation_seq
    having count(*) > 1
)

select * from final
order by partition, uid, session_id, index, incarnation_seq
