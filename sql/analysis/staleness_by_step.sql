-- name: staleness_by_step
-- description: per partition and trainer step, the off-policy profile of the trajectories
--   trained on (non-padding rows of sampled groups): how many, their staleness
--   (step - 1) - max_global_steps (mean / max / min), worst staleness (step - 1) -
--   min_global_steps (mean / max) and span max - min + 1 (mean / max) — SPEC §2 and §6.2.
-- params: none
-- reads: trajectory_fates
-- returns: partition, step, n_trajectories, staleness_mean, staleness_max, staleness_min,
--   staleness_worst_mean, staleness_worst_max, span_mean, span_max
with
trained as (
    select partition, fate_step as step, staleness, staleness_worst, span
    from trajectory_fates
    where fate = 'sampled' and not is_padding
),

final as (
    select
        partition,
        step,
        count(*) as n_trajectories,
        avg(staleness) as staleness_mean,
        max(staleness) as staleness_max,
        min(staleness) as staleness_min,
        avg(staleness_worst) as staleness_worst_mean,
        max(staleness_worst) as staleness_worst_max,
        avg(span) as span_mean,
        max(span) as span_max
    from trained
    group by partition, step
)

select * from final
order by partition, step
