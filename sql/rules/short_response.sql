-- name: short_response
-- description: opt-in (not in verl): a finished group in which some trajectory's response is
--   shorter than min_response_length tokens is evicted, compared exactly as
--   response_tokens_min < min_response_length (a response of exactly that length is kept).
--   Refilled like any eviction (counts like a filtered group in sync DAPO).
-- params: min_response_length BIGINT >= 1
-- reads: candidates
-- returns: partition, uid, global_steps
-- reason: short_response
-- horizon: none
-- metric: short_response/evicted_samples
-- credit: 2
select partition, uid, global_steps
from candidates
where (
    status = 'finished' and response_tokens_min < $min_response_length
)
order by partition, global_steps, term_seq, uid
