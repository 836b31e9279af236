-- name: zero_variance
-- description: DAPO dynamic sampling: a finished group with more than one trajectory whose
--   filter-metric values are all present and exactly equal (min = max; exact, so 0.1 three
--   times is equal and two distinct tiny values are not) is evicted. Its single value is recorded
--   in the decision and counted in the filtered reward counts.
-- params: none
-- reads: candidates
-- returns: partition, uid, global_steps
-- reason: zero_variance
-- horizon: none
-- metric: filter_groups/evicted_samples
-- value: metric_min
-- credit: 2
select partition, uid, global_steps
from candidates
where (
    status = 'finished' and n_traj > 1 and metric_nulls = 0 and metric_min = metric_max
)
order by partition, global_steps, term_seq, uid
