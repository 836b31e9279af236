-- name: no_group_in_two_batches
-- description: audit — a group is handed out at most once: more than one `select` decision for
--   the same (partition, uid) is a violation, whether in two batches or twice in one.
-- params: none
-- reads: decisions
-- returns: partition, uid, n_selects, batch_ids
with
selects as (
    select partition, uid, batch_id, seq from decisions where kind = 'select'
),

final as (
    select
        partition, uid,
        count(*) as n_selects,
        list(batch_id order by seq) as batch_ids
    from selects
    group by partition, uid
    having count(*) > 1
)

select * from final
order by partition, uid
