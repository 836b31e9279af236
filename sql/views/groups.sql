-- name: groups
-- description: one row per registered prompt group: its current dispatch step, last status,
--   terminal event, the trajectories of its current incarnation (a re-issue drops the earlier
--   ones), and its fate in the decision log: sampled, evicted (reason = every reason, sorted,
--   comma-joined), discarded, or live (see group_fates). `effective_status` is `failure` for a
--   finished group without trajectories; the live buffer compiles that CASE (the step
--   `status_words`) for the groups it holds, so both engines treat such a group alike.
--   `prompt_id` is the dataset id the group was registered with (null when none was given, or
--   the lake predates prompt ids); `dataset` the dataset name it was registered with (null
--   likewise).
-- params: none
-- reads: group_events, trajectories, group_fates
-- returns: partition, uid, global_steps, status, effective_status, registered_seq, reissued_seq,
--   term_seq, n_expected, n_traj, fate, reason, batch_id, fate_step, fate_seq, released,
--   prompt_id, dataset
with
events as (
    select partition, uid, event, global_steps, n, prompt_id, dataset, seq from group_events
),
trajs as (
    select partition, uid, seq from trajectories
),
fates as (
    select partition, uid, fate, reason, batch_id, fate_step, fate_seq, release_seq
    from group_fates
),

lifecycle as (
    select
        partition,
        uid,
        min(seq) filter (where event = 'registered') as registered_seq,
        max(seq) filter (where event = 'reissued') as reissued_seq,
        min(seq) filter (where event in ('finished', 'failure')) as term_seq,
        max(n) filter (where event = 'registered') as n_expected,
        max(prompt_id) filter (where event = 'registered') as prompt_id,
        max(dataset) filter (where event = 'registered') as dataset,
        arg_max(event, seq) as last_event,
        arg_max(global_steps, seq) filter (where event in ('registered', 'reissued'))
            as global_steps
    from events
    group by partition, uid
),
current_trajs as (
    select l.partition, l.uid, count(t.seq) as n_traj
    from lifecycle as l
    left join trajs as t
        on t.partition = l.partition and t.uid = l.uid and t.seq > coalesce(l.reissued_seq, -1)
    group by l.partition, l.uid
),
status_words as (
    select
        l.partition,
        l.uid,
        case when last_event in ('registered', 'reissued') then 'pending'
             else last_event end as status,
        case when last_event = 'finished' and n_traj = 0 then 'failure'
             when last_event in ('registered', 'reissued') then 'pending'
             else last_event end as effective_status
    from lifecycle as l
    join current_trajs as c on c.partition = l.partition and c.uid = l.uid
),

final as (
    select
        l.partition,
        l.uid,
        l.global_steps,
        s.status,
        s.effective_status,
        l.registered_seq,
        l.reissued_seq,
        l.term_seq,
        l.n_expected,
        c.n_traj,
        f.fate,
        f.reason,
        f.batch_id,
        f.fate_step,
        f.fate_seq,
        f.release_seq is not null as released,
        l.prompt_id,
        l.dataset
    from lifecycle as l
    join current_trajs as c on c.partition = l.partition and c.uid = l.uid
    join status_words as s on s.partition = l.partition and s.uid = l.uid
    join fates as f on f.partition = l.partition and f.uid = l.uid
)

select * from final
order by partition, registered_seq, uid
