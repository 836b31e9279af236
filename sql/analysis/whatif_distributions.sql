-- name: whatif_distributions
-- description: the response length and reward distributions of what one run trained against
--   what it generated, as `replaylake whatif --compare` tests them for bias (shorter answers
--   finish first, so a policy that evicts late groups can skew training toward them): per
--   measure and value, the trajectories trained and generated (non-padding; `saved_reason` as
--   in whatif_waste: groups evicted for it were never generated), their empirical cumulative
--   distributions at the value, and the two-sample Kolmogorov-Smirnov statistic of the measure
--   (the largest gap between the two cumulative distributions; 0 = trained like generated,
--   null when nothing was trained). Rewards not known (null) are left out of the reward
--   measure. Trained rows are a subset of the generated ones, so the
--   statistic is a distance, not a test between independent samples.
-- params: saved_reason VARCHAR
-- reads: trajectory_fates
-- returns: measure, value, n_trained, n_generated, cdf_trained, cdf_generated, ks
with
rows as (
    select fate = 'sampled' as trained, response_len::double as response_len, reward
    from trajectory_fates
    where not is_padding
      and not coalesce(fate = 'evicted' and $saved_reason <> ''
                       and list_contains(string_split(reason, ','), $saved_reason), false)
),
measured as (
    select 'response_len' as measure, response_len as value, trained from rows
    union all
    select 'reward' as measure, reward as value, trained from rows
    where reward is not null           -- a reward not known (not sent, or not read) is no value
),
counts as (
    select
        measure, value, count(*) filter (where trained) as n_trained, count(*) as n_generated
    from measured
    group by measure, value
),
cdf as (
    select
        measure, value, n_trained, n_generated,
        sum(n_trained) over upto
            / nullif(sum(n_trained) over (partition by measure), 0) as cdf_trained,
        sum(n_generated) over upto / sum(n_generated) over (partition by measure) as cdf_generated
    from counts
    window upto as (partition by measure order by value
                    rows between unbounded preceding and current row)
),

final as (
    select
        measure, value, n_trained, n_generated, cdf_trained::double as cdf_trained,
        cdf_generated::double as cdf_generated,
        max(abs(cdf_trained - cdf_generated)) over (partition by measure)::double as ks
    from cdf
)

select * from final
order by measure, value
