-- name: evictions_by_reason
-- description: per partition, trainer step and reason, how many groups were evicted and their
--   group span (mean / max). A group evicted for two reasons counts under each (SPEC §5).
-- params: none
-- reads: decisions
-- returns: partition, step, reason, n_groups, span_mean, span_max
with
evictions as (
    select partition, step, reason, uid, span from decisions where kind = 'evict'
),

final as (
    select
        partition, step, reason,
        count(distinct uid) as n_groups,
        avg(span) as span_mean,
        max(span) as span_max
    from evictions
    group by partition, step, reason
)

select * from final
order by partition, step, reason
