-- name: inflight
-- description: pending and running groups of the lake (the relation the wait gate reads)
-- params: none
-- reads: groups
-- returns: partition, uid, global_steps, status, prompt_id, dataset
with
grps as (
    select partition, uid, global_steps, status, fate, registered_seq, prompt_id, dataset
    from groups
),

final as (
    select partition, uid, global_steps, status, registered_seq, prompt_id, dataset
    from grps
    where status in ('pending', 'running') and fate = 'live'
)

select partition, uid, global_steps, status, prompt_id, dataset from final
order by partition, global_steps, registered_seq, uid
