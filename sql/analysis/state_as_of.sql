-- name: state_as_of
-- description: time travel: every group registered by the end of trainer step
--   `step`, with its status and fate at that moment. "End of step s" is everything the lake
--   recorded before the first decision taken at a later step (the whole lake when there is
--   none), so it includes the rollouts that arrived while step s trained.
-- params: step BIGINT
-- reads: group_events, trajectories, decisions, group_fates
-- returns: partition, uid, global_steps, status, fate, reason, batch_id, released, n_traj
with
events as (
    select partition, uid, event, global_steps, seq from group_events
),
trajs as (
    select partition, uid, seq from trajectories
),
decs as (
    select kind, step, seq from decisions
),

cutoff as (
    select coalesce(min(seq), 9223372036854775807) as seq
    from decs
    where step > $step and kind <> 'release'
),
lifecycle as (
    select
        e.partition, e.uid,
        min(e.seq) filter (where e.event = 'registered') as registered_seq,
        max(e.seq) filter (where e.event = 'reissued') as reissued_seq,
        arg_max(e.event, e.seq) as last_event,
        arg_max(e.global_steps, e.seq) filter (where e.event in ('registered', 'reissued'))
            as global_steps
    from events as e, cutoff as c
    where e.seq < c.seq
    group by e.partition, e.uid
),
n_trajs as (
    select l.partition, l.uid, count(t.seq) as n_traj
    from lifecycle as l
    cross join cutoff as c
    left join trajs as t
        on t.partition = l.partition and t.uid = l.uid
        and t.seq > coalesce(l.reissued_seq, -1) and t.seq < c.seq
    group by l.partition, l.uid
),
fates as (
    select
        f.partition, f.uid, f.fate, f.reason, f.batch_id,
        f.fate_seq < c.seq as decided,
        coalesce(f.release_seq < c.seq, false) as released
    from group_fates as f, cutoff as c
),

final as (
    select
        l.partition, l.uid, l.global_steps,
        case when l.last_event in ('registered', 'reissued') then 'pending'
             else l.last_event end as status,
        -- the fate the group had then: live until its decision (group_fates' words)
        case when f.decided then f.fate else 'live' end as fate,
        case when f.decided then f.reason end as reason,
        case when f.decided then f.batch_id end as batch_id,
        f.released,
        n.n_traj,
        l.registered_seq
    from lifecycle as l
    join n_trajs as n on n.partition = l.partition and n.uid = l.uid
    join fates as f on f.partition = l.partition and f.uid = l.uid
    where l.registered_seq is not null
)

select partition, uid, global_steps, status, fate, reason, batch_id, released, n_traj
from final
order by partition, registered_seq, uid
