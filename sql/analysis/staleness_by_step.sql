-- name: staleness_by_step
-- description: per partition and trainer step, the off-policy profile of the trajectories
--   trained on (non-padding rows of sampled groups): how many, their staleness at the step
--   (mean / max / min), worst staleness (mean / max), trajectory span (mean / max), the
--   staleness weighted by response tokens and the exact per-token staleness (mean / max, over
--   rows that reported version spans). A view of `off_policy`: the formulas live in
--   `provenance` and `off_policy` only.
-- params: none
-- reads: off_policy
-- returns: partition, step, n_trajectories, staleness_mean, staleness_max, staleness_min,
--   staleness_worst_mean, staleness_worst_max, span_mean, span_max, token_staleness_mean,
--   token_staleness_exact_mean, token_staleness_exact_max
with
per_step as (
    select * from off_policy
),

final as (
    select
        partition,
        step,
        n_trajectories::bigint as n_trajectories,
        trajectory_staleness_mean as staleness_mean,
        trajectory_staleness_max as staleness_max,
        trajectory_staleness_min as staleness_min,
        trajectory_staleness_worst_mean as staleness_worst_mean,
        trajectory_staleness_worst_max as staleness_worst_max,
        trajectory_spans_mean as span_mean,
        trajectory_spans_max as span_max,
        token_staleness_mean,
        token_staleness_exact_mean,
        token_staleness_exact_max
    from per_step
)

select * from final
order by partition, step
