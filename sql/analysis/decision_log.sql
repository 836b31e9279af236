-- name: decision_log
-- description: the decision log per poll: for every poll of every sample call that decided
--   something, the groups evicted (in all, and per reason as a map reason -> groups, so a new
--   rule shows up without touching this file), the refill prompts asked, the groups selected
--   (and the batch) and the surplus discarded, in the order they happened. `replaces` lists the
--   evicted uids the poll's refills replace (null when the poll asked for no refill). A refill
--   whose refill_fn raised has a `refill_failed` row beside it: it served nothing, so it counts
--   in `refill_failed` (prompts), not in `refilled`, and replaces nothing (the prompts stay owed
--   and a later poll asks for them again, naming the same evicted groups). `held_back`: the
--   prompts owed and not asked after the poll (a `refill_deferred` row: admission held them
--   back, or an earlier ask was still running; the next refill asks for them), else 0.
-- params: none
-- reads: decisions
-- returns: partition, step, call_id, poll, evicted, evicted_by_reason, refilled, selected,
--   batch_id, discarded, first_seq, replaces, refill_failed, held_back
with
decs as (
    select partition, step, call_id, poll, kind, uid, reason, batch_id, count, replaces, seq
    from decisions
    where kind <> 'release'
),

per_poll as (
    select
        partition, step, call_id, poll,
        count(distinct uid) filter (where kind = 'evict') as evicted,
        histogram(reason) filter (where kind = 'evict') as evicted_by_reason,
        (coalesce(sum(count) filter (where kind = 'refill'), 0)
            - coalesce(sum(count) filter (where kind = 'refill_failed'), 0))::bigint as refilled,
        coalesce(sum(count) filter (where kind = 'refill_failed'), 0)::bigint as refill_failed,
        count(*) filter (where kind = 'select') as selected,
        min(batch_id) filter (where kind = 'select') as batch_id,
        count(*) filter (where kind = 'discard') as discarded,
        min(seq) as first_seq,
        case when bool_or(kind = 'refill_failed') then null
             else flatten(list(replaces order by seq) filter (where kind = 'refill'
                                                          and replaces is not null))
        end as replaces,
        coalesce(arg_max(count, seq) filter (where kind = 'refill_deferred'), 0)::bigint
            as held_back
    from decs
    group by partition, step, call_id, poll
),

final as (
    select
        partition, step, call_id, poll, evicted,
        coalesce(evicted_by_reason, map([], []))::map(varchar, bigint) as evicted_by_reason,
        refilled, selected, batch_id, discarded, first_seq, replaces, refill_failed, held_back
    from per_poll
)

select * from final
order by first_seq
