-- name: stale
-- description: the `drop` staleness rule: a finished group whose group span
--   step - global_steps + 1 exceeds its bound is evicted (span exactly the bound is kept). A
--   group's bound is its dataset's in `stale_bounds` (a max_off_policy_threshold mapping), else
--   the default `threshold`; `tightest` is the smallest bound of any dataset (the threshold when
--   none has its own): the horizon, before which no group can be over its bound. Only finished groups with trajectories
--   qualify (the rest count as failures).
-- params: step BIGINT, threshold BIGINT, tightest BIGINT
-- reads: candidates, stale_bounds
-- returns: partition, uid, global_steps
-- reason: stale
-- lookup: stale_bounds on dataset
-- horizon: $step - $tightest + 1
-- metric: off_policy/evicted_samples
-- spread: off_policy/evicted_samples_staleness
-- credit: 0
with
bounded as (
    -- no group dispatched at or after the horizon is over any bound (tightest <= every bound)
    select c.*, b.bound
    from candidates as c
    left join stale_bounds as b on b.dataset = c.dataset
    where c.global_steps < $step - $tightest + 1
)

select partition, uid, global_steps
from bounded
where (
    status = 'finished' and $step - global_steps + 1 > coalesce(bound, $threshold)
)
order by partition, global_steps, term_seq, uid
