-- name: finished_groups_complete
-- description: audit — a finished group is complete: its current incarnation (the trajectories
--   that arrived after its last re-issue) holds a trajectory for every session 0..n-1, where n
--   is the session count it was registered with. Ingest refuses `finished` for a group with
--   fewer sessions and refuses a session >= n, so a missing session means the lake lost
--   trajectories (a salvage that set a damaged write aside, say). Not checked: groups that
--   ended in `failure`, which may hold any part of their sessions (a producer gives up on a
--   group at any point), and groups registered without n (the shorthand without `n=`, and the
--   verl adapter, whose buffer never says how many), which promise no count: ingest lets them
--   finish with any number of trajectories, none included (an empty group reads as a failure).
-- params: none
-- reads: group_events, trajectories
-- returns: partition, uid, n_expected, n_sessions, missing
with
events as (
    select partition, uid, event, n, seq from group_events
),
trajs as (
    select partition, uid, session_id, seq from trajectories
),

finished as (
    select
        partition, uid,
        max(n) filter (where event = 'registered') as n_expected,
        max(seq) filter (where event = 'reissued') as reissued_seq,
        arg_min(event, seq) filter (where event in ('finished', 'failure')) as terminal
    from events
    group by partition, uid
    having terminal = 'finished' and n_expected is not null
),
missing as (
    select f.partition, f.uid, f.n_expected, r.session
    from finished as f
    cross join range(f.n_expected) as r(session)
    left join trajs as t
        on t.partition = f.partition and t.uid = f.uid and t.session_id = r.session
        and t.seq > coalesce(f.reissued_seq, -1)
    where t.uid is null
),

final as (
    select partition, uid, n_expected, n_expected - count(*) as n_sessions,
           list(session order by session) as missing
    from missing
    group by partition, uid, n_expected
)

select * from final
order by partition, uid
