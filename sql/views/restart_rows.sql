-- name: restart_rows
-- description: every trajectory in the lake with what restarts did to it. A re-issue after a
--   restart (a `reissued` event) either keeps its group's stored rows (`resume`: kept_rows > 0,
--   and it writes those rows again right after the event) or drops them (`reissue`).
--   at_restart: a re-issue of its group came after the row (a session completed when the
--   process died); kept: the first such re-issue kept it; is_copy: one of the rows a keeping
--   re-issue wrote again (the group's first kept_rows rows after the event), not a generation of
--   its own; redone: generated after a re-issue of its group (a session generated again).
--   response_len is the stored token count; generation_s the rollout seconds, where recorded.
--   A re-issue written before kept_rows existed reads as dropping its rows.
-- params: none
-- reads: group_events, trajectories
-- returns: partition, uid, session_id, index, seq, response_len, generation_s, is_padding,
--   at_restart, kept, is_copy, redone
with
reissues as (
    select partition, uid, seq, kept_rows
    from group_events
    where event = 'reissued'
),
trajs as (
    select partition, uid, session_id, index, seq, n_response_tokens as response_len,
           generation_s, is_padding
    from trajectories
),

first_after as (
    select t.partition, t.uid, t.seq, coalesce(arg_min(r.kept_rows, r.seq), 0) > 0 as kept
    from trajs as t
    join reissues as r on r.partition = t.partition and r.uid = t.uid and r.seq > t.seq
    group by t.partition, t.uid, t.seq
),
copies as (
    select t.partition, t.uid, t.seq
    from trajs as t
    join reissues as r on r.partition = t.partition and r.uid = t.uid and r.seq < t.seq
    where coalesce(r.kept_rows, 0) > 0
    qualify row_number() over (partition by r.partition, r.uid, r.seq order by t.seq)
        <= r.kept_rows
),
after_one as (
    select distinct t.partition, t.uid, t.seq
    from trajs as t
    join reissues as r on r.partition = t.partition and r.uid = t.uid and r.seq < t.seq
)

select
    t.partition, t.uid, t.session_id, t.index, t.seq, t.response_len, t.generation_s,
    t.is_padding,
    f.seq is not null as at_restart,
    coalesce(f.kept, false) as kept,
    c.seq is not null as is_copy,
    a.seq is not null and c.seq is null as redone
from trajs as t
left join first_after as f on f.partition = t.partition and f.uid = t.uid and f.seq = t.seq
left join copies as c on c.partition = t.partition and c.uid = t.uid and c.seq = t.seq
left join after_one as a on a.partition = t.partition and a.uid = t.uid and a.seq = t.seq
order by t.partition, t.seq
