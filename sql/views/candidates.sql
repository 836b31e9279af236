-- name: candidates
-- description: the candidate table of the lake's current state, as the live buffer holds it:
--   every terminal group still live (not sampled, evicted or discarded) with the aggregates the
--   rules read. A group without trajectories has n_traj 0 and null aggregates, and counts as a
--   failure even when it finished (the groups view's `effective_status`). Run the files of `sql/rules/` over it for audits and what-if.
-- params: none
-- reads: groups, group_aggregates
-- returns: partition, uid, global_steps, term_seq, status, n_traj, metric_min, metric_max,
--   metric_nulls, response_tokens_sum, response_tokens_min, response_tokens_max, min_version,
--   max_version, dataset
with
terminal as (
    select partition, uid, global_steps, term_seq, effective_status, dataset
    from groups
    where effective_status in ('finished', 'failure') and fate = 'live'
),
aggs as (
    select
        partition, uid, n_traj, metric_min, metric_max, metric_nulls, response_tokens_sum,
        response_tokens_min, response_tokens_max, min_version, max_version
    from group_aggregates
),

joined as (
    select
        g.partition, g.uid, g.global_steps, g.term_seq, g.effective_status, a.n_traj,
        a.metric_min, a.metric_max, a.metric_nulls, a.response_tokens_sum, a.response_tokens_min,
        a.response_tokens_max, a.min_version, a.max_version, g.dataset
    from terminal as g
    left join aggs as a on a.partition = g.partition and a.uid = g.uid
),

-- the candidate row; for a group without trajectories (no aggregates row) these items are its
-- empty aggregates, which the live buffer derives from this text
final as (
    select
        partition,
        uid,
        global_steps::bigint as global_steps,
        term_seq::bigint as term_seq,
        effective_status as status,
        coalesce(n_traj, 0)::bigint as n_traj,
        metric_min::double as metric_min,
        metric_max::double as metric_max,
        coalesce(metric_nulls, 0)::bigint as metric_nulls,
        response_tokens_sum::bigint as response_tokens_sum,
        response_tokens_min::bigint as response_tokens_min,
        response_tokens_max::bigint as response_tokens_max,
        min_version::bigint as min_version,
        max_version::bigint as max_version,
        dataset
    from joined
)

select * from final
order by partition, global_steps, term_seq, uid
