-- name: missing_metric
-- description: a check, not an eviction: finished groups with a trajectory that lacks the filter
--   metric. While the zero-variance filter is on, a poll that finds any raises before it evicts
--   anything, naming up to five of them (a silent keep or drop would bias training).
-- params: none
-- reads: candidates
-- returns: partition, uid, global_steps
-- check: missing_metric
-- horizon: none
select partition, uid, global_steps
from candidates
where (
    status = 'finished' and metric_nulls > 0
)
order by partition, global_steps, term_seq, uid
