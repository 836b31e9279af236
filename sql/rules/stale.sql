-- name: stale
-- description: the `drop` staleness rule: a finished group whose group span
--   step - global_steps + 1 exceeds the threshold is evicted (span exactly the threshold is
--   kept). Only finished groups with trajectories qualify (the rest count as failures).
-- params: step BIGINT, threshold BIGINT
-- reads: candidates
-- returns: partition, uid, global_steps
-- reason: stale
-- horizon: $step - $threshold + 1
-- metric: off_policy/evicted_samples
-- spread: off_policy/evicted_samples_staleness
-- credit: 0
select partition, uid, global_steps
from candidates
where (
    status = 'finished' and $step - global_steps + 1 > $threshold
)
order by partition, global_steps, term_seq, uid
