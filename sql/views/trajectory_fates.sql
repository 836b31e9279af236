-- name: trajectory_fates
-- description: one row per trajectory in the lake (metadata, no token payload) with its group's
--   dispatch step and fate; `fate` is `dropped` for a partial trajectory a re-issue discarded.
--   staleness / staleness_worst are at the step that trained it (sampled rows only).
-- params: none
-- reads: trajectories, groups
-- returns: partition, uid, session_id, index, seq, min_global_steps, max_global_steps, span,
--   reward, reward_info, response_len, is_padding, global_steps, fate, reason, batch_id, fate_step,
--   staleness, staleness_worst
with
trajs as (
    select
        partition, uid, session_id, index, seq, min_global_steps, max_global_steps, reward,
        reward_info, len(response_ids) as response_len, is_padding
    from trajectories
),
grps as (
    select partition, uid, global_steps, reissued_seq, fate, reason, batch_id, fate_step
    from groups
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
        g.fate_step
    from trajs as t
    left join grps as g on g.partition = t.partition and g.uid = t.uid
),

final as (
    select
        partition, uid, session_id, index, seq, min_global_steps, max_global_steps, span, reward,
        reward_info, response_len, is_padding, global_steps, fate,
        case when fate = 'dropped' then null else reason end as reason,
        case when fate = 'dropped' then null else batch_id end as batch_id,
        case when fate = 'dropped' then null else fate_step end as fate_step,
        case when fate = 'sampled' then (fate_step - 1) - max_global_steps end as staleness,
        case when fate = 'sampled' then (fate_step - 1) - min_global_steps end as staleness_worst
    from joined
)

select * from final
order by partition, seq
