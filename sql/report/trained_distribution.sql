-- name: trained_distribution
-- description: the distribution of staleness and span over the trajectories trained at each
--   step (non-padding rows of the `provenance` view, where both formulas live): per partition,
--   step, measure (`staleness` or `span`) and value, how many trajectories and how many
--   response tokens had that value.
-- params: none
-- reads: provenance
-- returns: partition, step, measure, value, n_trajectories, n_tokens
with
trained as (
    select partition, step, staleness, span, n_response_tokens
    from provenance
    where not is_padding
),

long as (
    select partition, step, 'staleness' as measure, staleness as value, n_response_tokens
    from trained
    union all
    select partition, step, 'span' as measure, span as value, n_response_tokens
    from trained
),

final as (
    select
        partition, step, measure, value,
        count(*) as n_trajectories,
        coalesce(sum(n_response_tokens), 0)::bigint as n_tokens
    from long
    group by partition, step, measure, value
)

select * from final
order by partition, step, measure, value
