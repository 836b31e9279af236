-- name: wait_gate_blockers
-- description: the `wait` gate: in-flight (pending or running) groups with group span
--   step - global_steps + 1 >= threshold (note >=: such a group would be over the bound by the
--   time it trains). `sample` on a partition may return only when this is empty for it.
--   Applies to validation partitions too, as in verl. The live buffer compiles the predicate
--   between `where (` and `)` and asks it of the oldest in-flight group (the largest span).
-- params: step BIGINT, threshold BIGINT
-- reads: inflight
-- returns: partition, uid, global_steps, group_span
with
flying as (
    select partition, uid, global_steps, $step - global_steps + 1 as group_span
    from inflight
    where status in ('pending', 'running')
)

select partition, uid, global_steps, group_span
from flying
where (
    $step - global_steps + 1 >= $threshold
)
order by partition, global_steps, uid
