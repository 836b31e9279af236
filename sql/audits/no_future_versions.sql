-- name: no_future_versions
-- description: audit — trained rows whose newest weight version is not older than the step that
--   trained on them (staleness below 0: a version "from the future"). verl computes its metrics
--   regardless; replaylake keeps those numbers too but warns, and this query lists the rows, which
--   usually mean the rollout side tags versions with the wrong step.
-- params: none
-- reads: provenance
-- returns: partition, step, batch_id, uid, seq, max_global_steps, staleness
with
trained as (
    select partition, step, batch_id, uid, seq, max_global_steps, staleness, is_padding
    from provenance
),

final as (
    select partition, step, batch_id, uid, seq, max_global_steps, staleness
    from trained
    where staleness < 0 and not is_padding
)

select * from final
order by partition, step, batch_id, seq
