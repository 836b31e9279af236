-- name: lineage
-- description: one group's (one prompt's) path through the buffer, in arrival order: dispatch,
--   status changes, each trajectory with its weight versions and reward, every decision about
--   it (eviction with reason and value = the filter verdict, selection with batch and step,
--   discard, release), a `replaced` row for every served refill that asked for a prompt in its
--   place (not for an ask whose refill_fn raised),
--   and a final `verdict` row (trained at step / evicted: reasons / discarded / dropped by
--   re-issue / live / never registered: a uid without group events; a uid the lake holds
--   nothing of gets that one row, without a partition). The dispatch row names the group's
--   prompt_id and dataset when it has them. Every partition holding the uid is shown.
-- params: uid VARCHAR
-- reads: group_events, trajectory_fates, decisions, groups
-- returns: partition, seq, stage, step, session_id, index, min_global_steps, max_global_steps,
--   reward, detail
with
events as (
    select partition, seq, event, global_steps, prompt_id, dataset from group_events
    where uid = $uid
),
trajs as (
    select partition, seq, session_id, index, min_global_steps, max_global_steps, span, reward,
           fate
    from trajectory_fates
    where uid = $uid
),
decs as (
    select partition, seq, kind, step, reason, group_span, value, batch_id, count
    from decisions
    where uid = $uid
),
repl as (
    -- a refill whose refill_fn raised (a refill_failed row of the same call and poll) replaced
    -- nothing: only the ask that was served is shown
    select r.partition, r.seq, r.step, r.call_id, r.poll, r.count
    from decisions r
    where r.kind = 'refill' and list_contains(r.replaces, $uid)
      and not exists (
          select 1 from decisions f
          where f.kind = 'refill_failed' and f.partition = r.partition
            and f.call_id = r.call_id and f.poll = r.poll)
),
grp as (
    select partition, fate, reason, batch_id, fate_step, n_traj from groups where uid = $uid
),

timeline as (
    select
        partition, seq,
        case event when 'registered' then 'dispatch' else event end as stage,
        global_steps as step,
        null::integer as session_id, null::integer as index,
        null::bigint as min_global_steps, null::bigint as max_global_steps,
        null::double as reward,
        'global_steps=' || global_steps || coalesce(', prompt_id=' || prompt_id, '')
            || coalesce(', dataset=' || dataset, '') as detail
    from events
    union all
    select
        partition, seq, 'trajectory', null, session_id, index, min_global_steps,
        max_global_steps, reward,
        'span=' || span || case when fate = 'dropped' then ', dropped by re-issue' else '' end
    from trajs
    union all
    select
        partition, seq, kind, step, null, null, null, null, null,
        case kind
            when 'evict' then 'reason=' || reason || ', group_span=' || group_span
                || coalesce(', value=' || value, '')
            when 'select' then 'batch_id=' || batch_id || ', group_span=' || group_span
            when 'discard' then 'surplus, group_span=' || group_span
            when 'release' then 'batch_id=' || batch_id
            else kind
        end
    from decs
    union all
    select
        partition, seq, 'replaced', step, null, null, null, null, null,
        'by a refill of ' || count || ' prompt(s) (call ' || call_id || ', poll ' || poll || ')'
    from repl
),
verdict as (
    select
        partition, null::bigint as seq, 'verdict' as stage, fate_step as step,
        null::integer as session_id, null::integer as index,
        null::bigint as min_global_steps, null::bigint as max_global_steps,
        null::double as reward,
        case fate
            when 'sampled' then 'trained at step ' || fate_step || ' in batch ' || batch_id
            when 'evicted' then 'evicted at step ' || fate_step || ': ' || reason
            when 'discarded' then 'discarded as surplus at step ' || fate_step
            else 'live (' || n_traj || ' trajectories)'
        end as detail
    from grp
),
unregistered as (
    -- a uid the lake holds no group event of still ends with a verdict: one row per partition
    -- where only its trajectories or decisions are, and one without a partition when the lake
    -- never saw it at all (a mistyped uid reads as such, not as an empty lineage)
    select distinct partition from timeline
    where partition not in (select partition from grp)
    union all
    select null where not exists (select 1 from timeline) and not exists (select 1 from grp)
),
never as (
    select
        partition, null::bigint as seq, 'verdict' as stage, null::bigint as step,
        null::integer as session_id, null::integer as index,
        null::bigint as min_global_steps, null::bigint as max_global_steps,
        null::double as reward,
        'never registered' as detail
    from unregistered
),

final as (
    select * from timeline
    union all
    select * from verdict
    union all
    select * from never
)

select * from final
order by partition, seq nulls last, stage
