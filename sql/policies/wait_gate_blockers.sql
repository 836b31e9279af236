-- name: wait_gate_blockers
-- description: the `wait` gate: in-flight (pending or running) groups with group span
--   step - global_steps + 1 >= threshold (note >=: such a group would be over the bound by the
--   time it trains). `sample` on a partition may return only when this is empty for it.
--   Applies to validation partitions too, as in verl.
-- params: step BIGINT, threshold BIGINT
-- reads: inflight
-- returns: partition, uid, global_steps, group_span
with
flying as (
    select partition, uid, global_steps, status from inflight
),

spans as (
    select partition, uid, global_steps, $step - global_steps + 1 as group_span
    from flying
    where status in ('pending', 'running')
),

final as (
    select * from spans where group_span >= $threshold
)

select partition, uid, global_steps, group_span from final
order by partition, global_steps, uid
