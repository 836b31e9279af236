-- name: failure
-- description: failure groups: with evict_all every failure group is evicted (async), else only
--   failures without any trajectory (sync with sync_refill_failed_groups). A finished group with
--   no trajectory has status failure in the candidate table.
-- params: evict_all BOOLEAN
-- reads: candidates
-- returns: partition, uid, global_steps
-- reason: failure
-- horizon: none
-- metric: rollout_failure/evicted_samples
-- credit: 1
select partition, uid, global_steps
from candidates
where (
    status = 'failure' and ($evict_all or n_traj = 0)
)
order by partition, global_steps, term_seq, uid
