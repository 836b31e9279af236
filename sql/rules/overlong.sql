-- name: overlong
-- description: opt-in (max_response_length; not in verl): a finished group whose mean response
--   length in tokens exceeds max_response_length is evicted, compared exactly as
--   sum > max_response_length * n_traj. Refilled like any eviction (counts like a filtered group
--   in sync DAPO).
-- params: max_response_length BIGINT >= 1
-- reads: candidates
-- returns: partition, uid, global_steps
-- reason: overlong
-- horizon: none
-- metric: overlong/evicted_samples
-- credit: 2
select partition, uid, global_steps
from candidates
where (
    status = 'finished' and response_tokens_sum > $max_response_length * n_traj
)
order by partition, global_steps, term_seq, uid
