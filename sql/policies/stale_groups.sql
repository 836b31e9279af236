-- name: stale_groups
-- description: the `drop` stale rule (SPEC §5.1): finished groups whose group span
--   step - global_steps + 1 exceeds the threshold (span exactly T is kept). Failure groups,
--   finished groups without trajectories (they count as failures) and validation partitions
--   (`val`) are never stale-evicted.
-- params: step BIGINT, threshold BIGINT
-- reads: candidates
-- returns: partition, uid, global_steps, span
with
cands as (
    select partition, uid, global_steps, term_seq, status, n_traj from candidates
),

spans as (
    select *, $step - global_steps + 1 as span
    from cands
    where status = 'finished' and n_traj > 0 and partition <> 'val'
),

final as (
    select partition, uid, global_steps, span, term_seq
    from spans
    where span > $threshold
)

select partition, uid, global_steps, span from final
order by partition, global_steps, term_seq, uid
