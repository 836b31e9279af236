-- name: wait_gate_blockers
-- description: the `wait` gate (SPEC §5.2): in-flight (pending or running) groups with span
--   step - global_steps + 1 >= threshold (note >=: such a group would be over the bound by the
--   time it trains). `sample` on a partition may return only when this is empty for it.
--   Applies to validation partitions too, as in verl.
-- params: step BIGINT, threshold BIGINT
-- reads: inflight
-- returns: partition, uid, global_steps, span
with
flying as (
    select partition, uid, global_steps, status from inflight
),

spans as (
    select partition, uid, global_steps, $step - global_steps + 1 as span
    from flying
    where status in ('pending', 'running')
),

final as (
    select * from spans where span >= $threshold
)

select partition, uid, global_steps, span from final
order by partition, global_steps, uid
