-- name: whatif_waste
-- description: where one run's generation went, as `replaylake whatif --compare` prints it per
--   policy: groups and (non-padding) trajectories trained; wasted = generated and never trained
--   (groups evicted or discarded, and partial answers a re-issue dropped), with their response
--   tokens and generation seconds; saved = groups evicted for `saved_reason` (a what-if of
--   `admit` passes 'stale': those groups would not have been dispatched at all, so they count
--   as generation saved, not wasted; '' saves nothing); what is still live in the buffer at the
--   end of the lake; and the evicted groups per reason, saved ones left out (a group evicted for
--   two reasons counts under both). Generation seconds are the trajectories' `generation_s`,
--   summed where rollouts recorded it (null when no trajectory did).
-- params: saved_reason VARCHAR
-- reads: groups, trajectory_fates, decisions
-- returns: trained_groups, trained_trajectories, generated_trajectories, generated_tokens,
--   wasted_groups, wasted_trajectories, wasted_tokens, wasted_generation_s, saved_groups,
--   saved_trajectories, saved_tokens, saved_generation_s, live_groups, live_trajectories,
--   evicted_by_reason
with
grps as (
    select
        partition, uid,
        case when fate = 'sampled' then 'trained'
             when fate = 'evicted' and $saved_reason <> ''
                  and list_contains(string_split(reason, ','), $saved_reason) then 'saved'
             when fate in ('evicted', 'discarded') then 'wasted'
             else 'live' end as class
    from groups
),
trajs as (
    select
        case when t.fate = 'dropped' then 'wasted' else coalesce(g.class, 'live') end as class,
        t.response_len,
        t.generation_s
    from trajectory_fates as t
    left join grps as g on g.partition = t.partition and g.uid = t.uid
    where not t.is_padding
),
evictions as (
    select d.reason, count(distinct (d.partition, d.uid)) as n_groups
    from decisions as d
    join grps as g on g.partition = d.partition and g.uid = d.uid
    where d.kind = 'evict' and g.class <> 'saved'
    group by d.reason
),

final as (
    select
        (select count(*) from grps where class = 'trained') as trained_groups,
        count(*) filter (where class = 'trained') as trained_trajectories,
        count(*) filter (where class <> 'saved') as generated_trajectories,
        coalesce(sum(response_len) filter (where class <> 'saved'), 0)::bigint
            as generated_tokens,
        (select count(*) from grps where class = 'wasted') as wasted_groups,
        count(*) filter (where class = 'wasted') as wasted_trajectories,
        coalesce(sum(response_len) filter (where class = 'wasted'), 0)::bigint as wasted_tokens,
        sum(generation_s) filter (where class = 'wasted')::double as wasted_generation_s,
        (select count(*) from grps where class = 'saved') as saved_groups,
        count(*) filter (where class = 'saved') as saved_trajectories,
        coalesce(sum(response_len) filter (where class = 'saved'), 0)::bigint as saved_tokens,
        sum(generation_s) filter (where class = 'saved')::double as saved_generation_s,
        (select count(*) from grps where class = 'live') as live_groups,
        count(*) filter (where class = 'live') as live_trajectories,
        (select map(coalesce(list(reason order by reason), []),
                    coalesce(list(n_groups order by reason), []))
         from evictions) as evicted_by_reason
    from trajs
)

select * from final
