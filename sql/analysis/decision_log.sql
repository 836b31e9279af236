-- name: decision_log
-- description: the decision log per poll (SPEC §10.3): for every poll of every sample call that
--   decided something, the groups evicted (in all, and per reason), the refill prompts asked,
--   the groups selected (and the batch) and the surplus discarded, in the order they happened.
-- params: none
-- reads: decisions
-- returns: partition, step, call_id, poll, evicted, evicted_stale, evicted_zero_variance,
--   evicted_failure, refilled, selected, batch_id, discarded, first_seq
with
decs as (
    select partition, step, call_id, poll, kind, uid, reason, batch_id, count, seq
    from decisions
    where kind <> 'release'
),

final as (
    select
        partition, step, call_id, poll,
        count(distinct uid) filter (where kind = 'evict') as evicted,
        count(*) filter (where kind = 'evict' and reason = 'stale') as evicted_stale,
        count(*) filter (where kind = 'evict' and reason = 'zero_variance') as evicted_zero_variance,
        count(*) filter (where kind = 'evict' and reason = 'failure') as evicted_failure,
        coalesce(sum(count) filter (where kind = 'refill'), 0)::bigint as refilled,
        count(*) filter (where kind = 'select') as selected,
        min(batch_id) filter (where kind = 'select') as batch_id,
        count(*) filter (where kind = 'discard') as discarded,
        min(seq) as first_seq
    from decs
    group by partition, step, call_id, poll
)

select * from final
order by first_seq
