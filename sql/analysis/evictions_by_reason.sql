-- name: evictions_by_reason
-- description: per partition, trainer step and reason, how many groups were evicted and their
--   group span (mean / max). A group evicted for two reasons in one poll counts under each.
-- params: none
-- reads: decisions
-- returns: partition, step, reason, n_groups, group_span_mean, group_span_max
with
evictions as (
    select partition, step, reason, uid, group_span from decisions where kind = 'evict'
),

final as (
    select
        partition, step, reason,
        count(distinct uid) as n_groups,
        avg(group_span) as group_span_mean,
        max(group_span) as group_span_max
    from evictions
    group by partition, step, reason
)

select * from final
order by partition, step, reason
