-- name: conservation
-- description: audit — every registered group ends up in exactly one of live, sampled, evicted,
--   discarded. Violations: decisions of more than one fate kind for a group (problem
--   `several fates`), a group selected or discarded twice (`repeated <kind>`), evictions of one
--   group spread over several polls (`evicted in several polls`), a release of a group never
--   selected (`released, never selected`) or a decision about a group never registered
--   (`unregistered`). So registered = live + sampled + evicted + discarded holds.
-- params: none
-- reads: group_events, decisions
-- returns: partition, uid, problem, kinds
with
registered as (
    select distinct partition, uid from group_events where event = 'registered'
),
decs as (
    select partition, uid, kind, call_id, poll, seq
    from decisions
    where kind in ('select', 'evict', 'discard', 'release')
),

per_group as (
    select
        partition, uid,
        list(distinct kind order by kind) filter (where kind <> 'release') as fate_kinds,
        count(*) filter (where kind = 'select') as n_select,
        count(*) filter (where kind = 'discard') as n_discard,
        count(distinct (call_id, poll)) filter (where kind = 'evict') as n_evict_polls,
        count(*) filter (where kind = 'release') as n_release,
        list(kind order by seq) as kinds
    from decs
    group by partition, uid
),
problems as (
    select partition, uid, 'several fates' as problem, kinds
    from per_group where len(fate_kinds) > 1
    union all
    select partition, uid, 'repeated select', kinds from per_group where n_select > 1
    union all
    select partition, uid, 'repeated discard', kinds from per_group where n_discard > 1
    union all
    select partition, uid, 'evicted in several polls', kinds from per_group where n_evict_polls > 1
    union all
    select partition, uid, 'released, never selected', kinds
    from per_group where n_release > 0 and n_select = 0
    union all
    select p.partition, p.uid, 'unregistered', p.kinds
    from per_group as p
    left join registered as r on r.partition = p.partition and r.uid = p.uid
    where r.uid is null
)

select * from problems
order by partition, uid, problem
