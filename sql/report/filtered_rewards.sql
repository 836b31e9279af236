-- name: filtered_rewards
-- description: the filtered reward counts: per partition and trainer step, how many groups the
--   zero-variance filter evicted, by the one metric value all their responses shared (with a
--   0/1 reward: 0.0 = every response failed the prompt, 1.0 = every response solved it).
-- params: none
-- reads: decisions
-- returns: partition, step, value, n_groups
with
filtered as (
    select partition, step, uid, value
    from decisions
    where kind = 'evict' and reason = 'zero_variance'
),

final as (
    select partition, step, value, count(distinct uid) as n_groups
    from filtered
    group by partition, step, value
)

select * from final
order by partition, step, value
