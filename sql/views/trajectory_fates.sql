-- name: trajectory_fates
-- description: one row per trajectory in the lake (metadata, no token payload) with its group's
--   dispatch step and fate; `fate` is `dropped` for a partial trajectory a re-issue discarded.
--   A completed sibling that `resume` kept is one trajectory with one fate: the lake holds it
--   twice (before the `reissued` event, and written again right after it; see restart_rows),
--   and only the copy is listed.
--   staleness / staleness_worst are at the step that trained it (sampled rows only), taken from
--   the `provenance` view, where their formulas live. response_len is the token count stored at
--   ingest (the payload is never read); prompt_id is the group's dataset id, dataset its
--   dataset name; generation_s the rollout seconds the row took, where the rollout recorded it.
-- params: none
-- reads: trajectories, restart_rows, groups, provenance
-- returns: partition, uid, session_id, index, seq, min_global_steps, max_global_steps, span,
--   reward, reward_info, response_len, is_padding, global_steps, fate, reason, batch_id, fate_step,
--   staleness, staleness_worst, prompt_id, dataset, generation_s
with
trajs as (
    select
        partition, uid, session_id, index, seq, min_global_steps, max_global_steps, reward,
        reward_info, n_response_tokens as response_len, is_padding, generation_s
    from trajectories
),
-- a row a re-issue kept is represented by its copy (see restart_rows)
kept as (
    select partition, uid, seq from restart_rows where kept
),
grps as (
    select partition, uid, global_steps, reissued_seq, fate, reason, batch_id, fate_step,
           prompt_id, dataset
    from groups
),
-- A trained row's staleness depends only on its batch (hence step) and its versions, so these
-- keys are unique and the join below never duplicates a row.
trained as (
    select distinct
        partition, batch_id, uid, min_global_steps, max_global_steps, staleness, staleness_worst
    from provenance
),

joined as (
    select
        t.*,
        t.max_global_steps - t.min_global_steps + 1 as span,
        g.global_steps,
        case when t.seq < coalesce(g.reissued_seq, -1) then 'dropped'
             else coalesce(g.fate, 'orphan') end as fate,
        g.reason,
        g.batch_id,
        g.fate_step,
        g.prompt_id,
        g.dataset
    from trajs as t
    left join grps as g on g.partition = t.partition and g.uid = t.uid
    anti join kept as k on k.partition = t.partition and k.uid = t.uid and k.seq = t.seq
),

final as (
    select
        j.partition, j.uid, j.session_id, j.index, j.seq, j.min_global_steps,
        j.max_global_steps, j.span, j.reward, j.reward_info, j.response_len, j.is_padding,
        j.global_steps, j.fate,
        case when j.fate = 'dropped' then null else j.reason end as reason,
        case when j.fate = 'dropped' then null else j.batch_id end as batch_id,
        case when j.fate = 'dropped' then null else j.fate_step end as fate_step,
        p.staleness,
        p.staleness_worst,
        j.prompt_id,
        j.dataset,
        j.generation_s
    from joined as j
    left join trained as p
        on j.fate = 'sampled' and p.partition = j.partition and p.batch_id = j.batch_id
        and p.uid = j.uid and p.min_global_steps = j.min_global_steps
        and p.max_global_steps = j.max_global_steps
)

select * from final
order by partition, seq
