-- name: group_aggregates
-- description: the per-group aggregates every rule reads, one row per group that has at least
--   one trajectory (a group without trajectories gets n_traj 0 and nulls). `metric` is each
--   trajectory's filter-metric value (the reward sum, or a named reward metric; null when the
--   trajectory lacks it). The live buffer runs this over the trajectories of the groups that
--   turned terminal since its last poll; over the lake it feeds the `candidates` view.
-- params: none
-- reads: group_trajectories
-- returns: partition, uid, n_traj, metric_min, metric_max, metric_nulls, response_tokens_sum,
--   response_tokens_min, response_tokens_max, min_version, max_version
select
    partition,
    uid,
    count(*) as n_traj,
    min(metric) as metric_min,
    max(metric) as metric_max,
    count(*) - count(metric) as metric_nulls,
    cast(sum(n_response_tokens) as bigint) as response_tokens_sum,
    min(n_response_tokens) as response_tokens_min,
    max(n_response_tokens) as response_tokens_max,
    min(min_global_steps) as min_version,
    max(max_global_steps) as max_version
from group_trajectories
group by partition, uid
order by partition, uid
