-- name: resume_figures
-- description: what restarts cost, per partition, in the units generation is priced in. A
--   re-issue after a restart (`reissued` events) either keeps a group's stored trajectories
--   (`resume`: kept_rows > 0, the rows written again right after the event) or drops them
--   (`reissue`), as restart_rows tells. Each stored row a re-issue followed is a session
--   completed at a restart:
--   sessions_kept of sessions_at_restart were kept (reused_share), with the response tokens and
--   rollout seconds (generation_s; null where the rollout did not record it) they saved; the
--   rest were dropped (trajectories_lost: acknowledged, then thrown away; tokens_redone and
--   seconds_redone: the generation spent on them). prompts_skipped: groups registered before the
--   partition's first re-issue that never got a fate (trained, evicted or discarded);
--   trajectories_trained_twice: the trajectories of groups selected into more than one batch.
--   A re-issue written before kept_rows existed reads as dropping its rows.
-- params: none
-- reads: group_events, restart_rows, decisions, groups
-- returns: partition, interrupted_groups, sessions_at_restart, sessions_kept, reused_share,
--   trajectories_lost, prompts_skipped, trajectories_trained_twice, tokens_saved,
--   seconds_saved, tokens_redone, seconds_redone
with
reissues as (
    select partition, uid, seq
    from group_events
    where event = 'reissued'
),
restarted as (
    select partition, kept, response_len, generation_s
    from restart_rows
    where at_restart and not is_padding
),
grps as (
    select partition, uid, registered_seq, fate, n_traj
    from groups
),
selects as (
    select partition, uid, count(*) as n_selects
    from decisions
    where kind = 'select'
    group by partition, uid
),

restart_figures as (
    select
        partition,
        count(*) as sessions_at_restart,
        count(*) filter (where kept) as sessions_kept,
        count(*) filter (where not kept) as trajectories_lost,
        coalesce(sum(response_len) filter (where kept), 0) as tokens_saved,
        sum(generation_s) filter (where kept) as seconds_saved,
        coalesce(sum(response_len) filter (where not kept), 0) as tokens_redone,
        sum(generation_s) filter (where not kept) as seconds_redone
    from restarted
    group by partition
),
first_reissue as (
    select partition, min(seq) as seq, count(distinct uid) as interrupted_groups
    from reissues
    group by partition
),
group_figures as (
    select
        g.partition,
        count(*) filter (where g.registered_seq < f.seq and g.fate = 'live') as prompts_skipped,
        coalesce(sum(g.n_traj) filter (where s.n_selects > 1), 0) as trajectories_trained_twice
    from grps as g
    left join first_reissue as f on f.partition = g.partition
    left join selects as s on s.partition = g.partition and s.uid = g.uid
    group by g.partition
)

select
    g.partition,
    coalesce(f.interrupted_groups, 0) as interrupted_groups,
    coalesce(r.sessions_at_restart, 0) as sessions_at_restart,
    coalesce(r.sessions_kept, 0) as sessions_kept,
    r.sessions_kept / nullif(r.sessions_at_restart, 0) as reused_share,
    coalesce(r.trajectories_lost, 0) as trajectories_lost,
    g.prompts_skipped,
    g.trajectories_trained_twice,
    coalesce(r.tokens_saved, 0) as tokens_saved,
    r.seconds_saved,
    coalesce(r.tokens_redone, 0) as tokens_redone,
    r.seconds_redone
from group_figures as g
left join first_reissue as f on f.partition = g.partition
left join restart_figures as r on r.partition = g.partition
order by g.partition
