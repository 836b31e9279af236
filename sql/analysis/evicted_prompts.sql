-- name: evicted_prompts
-- description: which prompts keep getting evicted, and why: one row per prompt id (the dataset
--   id groups were registered with) that had at least one group evicted, with how many groups
--   of it were registered, evicted, trained, discarded or are still live, the evictions per
--   reason (a map reason -> groups; a group evicted for two reasons counts under both), the
--   share of its decided groups that were evicted, and the steps of its first and last
--   eviction. Groups registered without a prompt id are not counted. Most evicted first.
-- params: none
-- reads: groups, decisions
-- returns: partition, prompt_id, n_groups, evicted, trained, discarded, live, evicted_by_reason,
--   evicted_share, first_evicted_step, last_evicted_step
with
grps as (
    select partition, uid, prompt_id, fate
    from groups
    where prompt_id is not null
),
evictions as (
    select partition, uid, reason, step
    from decisions
    where kind = 'evict'
),

per_prompt as (
    select
        partition, prompt_id,
        count(*) as n_groups,
        count(*) filter (where fate = 'evicted') as evicted,
        count(*) filter (where fate = 'sampled') as trained,
        count(*) filter (where fate = 'discarded') as discarded,
        count(*) filter (where fate = 'live') as live
    from grps
    group by partition, prompt_id
),
reasons as (
    select
        g.partition, g.prompt_id,
        histogram(e.reason) as evicted_by_reason,
        min(e.step) as first_evicted_step,
        max(e.step) as last_evicted_step
    from grps as g
    join evictions as e on e.partition = g.partition and e.uid = g.uid
    where g.fate = 'evicted'
    group by g.partition, g.prompt_id
),

final as (
    select
        p.partition, p.prompt_id, p.n_groups, p.evicted, p.trained, p.discarded, p.live,
        r.evicted_by_reason::map(varchar, bigint) as evicted_by_reason,
        p.evicted / (p.evicted + p.trained + p.discarded) as evicted_share,
        r.first_evicted_step,
        r.last_evicted_step
    from per_prompt as p
    join reasons as r on r.partition = p.partition and r.prompt_id = p.prompt_id
    where p.evicted > 0
)

select * from final
order by evicted desc, evicted_share desc, partition, prompt_id
