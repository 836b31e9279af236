-- name: selection_bias
-- description: what training saw versus what was generated: per partition and
--   dispatch step, the non-padding trajectories of the current group incarnations in cohorts
--   generated (all) / trained / evicted / discarded / live, each with its count, mean response
--   length, mean reward, mean newest weight version and mean span.
-- params: none
-- reads: trajectory_fates
-- returns: partition, dispatch_step, cohort, n_trajectories, response_len_mean, reward_mean,
--   version_mean, span_mean
with
rows_of as (
    select partition, global_steps as dispatch_step, fate, response_len, reward,
           max_global_steps, span
    from trajectory_fates
    where not is_padding and fate not in ('dropped', 'orphan')
),

cohorts as (
    select *, 'generated' as cohort from rows_of
    union all
    select *, case fate when 'sampled' then 'trained' else fate end as cohort from rows_of
),
final as (
    select
        partition, dispatch_step, cohort,
        count(*) as n_trajectories,
        avg(response_len) as response_len_mean,
        avg(reward) as reward_mean,
        avg(max_global_steps) as version_mean,
        avg(span) as span_mean
    from cohorts
    group by partition, dispatch_step, cohort
)

select * from final
order by partition, dispatch_step,
    case cohort when 'generated' then 0 when 'trained' then 1 when 'evicted' then 2
                when 'discarded' then 3 else 4 end
