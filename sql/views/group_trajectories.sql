-- name: group_trajectories
-- description: the inputs of the group aggregates over the lake: one row per trajectory of the
--   current incarnation of every terminal (finished or failure) group, whatever its fate — a
--   re-issue drops the trajectories that arrived before it. `metric` is the filter metric the
--   connection was opened with (DuckDB variable `filter_metric`): the reward sum for `reward`,
--   else that entry of reward_info; null when the trajectory lacks it or no metric is set.
-- params: none
-- reads: groups, trajectories
-- returns: partition, uid, metric, n_response_tokens, min_global_steps, max_global_steps
with
grps as (
    select partition, uid, reissued_seq
    from groups
    where status in ('finished', 'failure')
),
trajs as (
    select partition, uid, seq, reward, reward_info, n_response_tokens, min_global_steps,
           max_global_steps
    from trajectories
),

current_trajs as (
    select
        t.partition,
        t.uid,
        t.seq,
        case when getvariable('filter_metric') = 'reward' then t.reward
             else t.reward_info[getvariable('filter_metric')] end::double as metric,
        t.n_response_tokens::bigint as n_response_tokens,
        t.min_global_steps,
        t.max_global_steps
    from trajs as t
    join grps as g
        on g.partition = t.partition and g.uid = t.uid and t.seq > coalesce(g.reissued_seq, -1)
)

select partition, uid, metric, n_response_tokens, min_global_steps, max_global_steps
from current_trajs
order by partition, uid, seq
