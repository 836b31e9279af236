-- name: prompt_history
-- description: the history of every dataset prompt, one row per prompt id (the id groups were
--   registered with; groups without one are not counted). Attempts: n_groups (groups
--   registered) and dispatches (registrations plus re-issues), the first and last dispatch
--   step. Fates: groups trained, evicted (evicted_by_reason: a map reason -> groups, empty when
--   none; a group evicted for two reasons counts under both), discarded, live, and the last step
--   one of its groups was trained at. Pass rate, over its completed responses (non-padding rows
--   a re-issue did not drop): n_responses, reward_mean / min / max, and `solved` (at least one
--   response, and every one got the best reward seen in the partition: 1 for a 0/1 reward);
--   scored_groups (finished groups of more than one response, every one with the filter metric)
--   and zero_variance_groups, those whose responses all share one metric value (the
--   zero_variance rule's condition), with their share. Response lengths: mean, max and
--   response_len_by_step, a list of {step, n_responses, len_mean, len_max} per dispatch step in
--   step order. Generation spent on it, in response tokens of every non-padding row: generated,
--   trained (groups sampled), wasted (groups evicted or discarded, and partial rows a re-issue
--   dropped; a sibling a resume kept is counted once, as trained) and the wasted share; tokens
--   of live groups are in generated only. Generation time is recorded only where the rollout
--   fills `generation_s`, so tokens are the measure.
-- params: none
-- reads: groups, group_events, group_aggregates, trajectory_fates
-- returns: partition, prompt_id, n_groups, dispatches, first_dispatch_step, last_dispatch_step,
--   trained, evicted, evicted_by_reason, discarded, live, last_trained_step, n_responses,
--   reward_mean, reward_min, reward_max, solved, scored_groups, zero_variance_groups,
--   zero_variance_share, response_len_mean, response_len_max, response_len_by_step,
--   tokens_generated, tokens_trained, tokens_wasted, wasted_share
with
grps as (
    select partition, uid, prompt_id, effective_status, fate, reason, fate_step
    from groups
    where prompt_id is not null
),
dispatch_events as (
    select partition, uid, global_steps
    from group_events
    where event in ('registered', 'reissued')
),
aggs as (
    select partition, uid, n_traj, metric_min, metric_max, metric_nulls
    from group_aggregates
),
rows_of as (
    select partition, prompt_id, global_steps, fate, reward, response_len
    from trajectory_fates
    where prompt_id is not null and not is_padding
),

per_prompt as (
    select
        g.partition, g.prompt_id,
        count(*) as n_groups,
        count(*) filter (where g.fate = 'sampled') as trained,
        count(*) filter (where g.fate = 'evicted') as evicted,
        count(*) filter (where g.fate = 'discarded') as discarded,
        count(*) filter (where g.fate = 'live') as live,
        max(g.fate_step) filter (where g.fate = 'sampled') as last_trained_step,
        count(*) filter (where g.effective_status = 'finished' and a.n_traj > 1
                         and a.metric_nulls = 0) as scored_groups,
        count(*) filter (where g.effective_status = 'finished' and a.n_traj > 1
                         and a.metric_nulls = 0 and a.metric_min = a.metric_max)
            as zero_variance_groups
    from grps as g
    left join aggs as a on a.partition = g.partition and a.uid = g.uid
    group by g.partition, g.prompt_id
),
dispatches as (
    select
        g.partition, g.prompt_id,
        count(*) as dispatches,
        min(d.global_steps) as first_dispatch_step,
        max(d.global_steps) as last_dispatch_step
    from grps as g
    join dispatch_events as d on d.partition = g.partition and d.uid = g.uid
    group by g.partition, g.prompt_id
),
reasons as (
    select partition, prompt_id, histogram(reason) as evicted_by_reason
    from (
        select partition, prompt_id, unnest(string_split(reason, ',')) as reason
        from grps
        where fate = 'evicted' and reason is not null
    )
    group by partition, prompt_id
),
responses as (
    select
        partition, prompt_id,
        count(*) filter (where fate <> 'dropped') as n_responses,
        avg(reward) filter (where fate <> 'dropped') as reward_mean,
        min(reward) filter (where fate <> 'dropped') as reward_min,
        max(reward) filter (where fate <> 'dropped') as reward_max,
        avg(response_len) filter (where fate <> 'dropped') as response_len_mean,
        max(response_len) filter (where fate <> 'dropped') as response_len_max,
        sum(response_len) as tokens_generated,
        sum(response_len) filter (where fate = 'sampled') as tokens_trained,
        sum(response_len) filter (where fate in ('evicted', 'discarded', 'dropped'))
            as tokens_wasted
    from rows_of
    group by partition, prompt_id
),
by_step as (
    select
        partition, prompt_id, global_steps as step,
        count(*) as n_responses,
        avg(response_len) as len_mean,
        max(response_len) as len_max
    from rows_of
    where fate <> 'dropped'
    group by partition, prompt_id, global_steps
),
length_history as (
    select
        partition, prompt_id,
        list({'step': step, 'n_responses': n_responses, 'len_mean': len_mean,
              'len_max': len_max} order by step) as response_len_by_step
    from by_step
    group by partition, prompt_id
),

joined as (
    select
        p.*,
        d.dispatches, d.first_dispatch_step, d.last_dispatch_step,
        r.evicted_by_reason,
        s.n_responses, s.reward_mean, s.reward_min, s.reward_max, s.response_len_mean,
        s.response_len_max, s.tokens_generated, s.tokens_trained, s.tokens_wasted,
        h.response_len_by_step,
        max(s.reward_max) over (partition by p.partition) as best_reward
    from per_prompt as p
    join dispatches as d on d.partition = p.partition and d.prompt_id = p.prompt_id
    left join reasons as r on r.partition = p.partition and r.prompt_id = p.prompt_id
    left join responses as s on s.partition = p.partition and s.prompt_id = p.prompt_id
    left join length_history as h on h.partition = p.partition and h.prompt_id = p.prompt_id
),

final as (
    select
        partition,
        prompt_id,
        n_groups,
        dispatches,
        first_dispatch_step::bigint as first_dispatch_step,
        last_dispatch_step::bigint as last_dispatch_step,
        trained,
        evicted,
        coalesce(evicted_by_reason, map())::map(varchar, bigint) as evicted_by_reason,
        discarded,
        live,
        last_trained_step::bigint as last_trained_step,
        coalesce(n_responses, 0) as n_responses,
        reward_mean::double as reward_mean,
        reward_min::double as reward_min,
        reward_max::double as reward_max,
        coalesce(n_responses > 0 and reward_min = best_reward, false) as solved,
        scored_groups,
        zero_variance_groups,
        zero_variance_groups / nullif(scored_groups, 0) as zero_variance_share,
        response_len_mean::double as response_len_mean,
        response_len_max::bigint as response_len_max,
        coalesce(response_len_by_step, []) as response_len_by_step,
        coalesce(tokens_generated, 0)::bigint as tokens_generated,
        coalesce(tokens_trained, 0)::bigint as tokens_trained,
        coalesce(tokens_wasted, 0)::bigint as tokens_wasted,
        coalesce(tokens_wasted, 0) / nullif(coalesce(tokens_generated, 0), 0) as wasted_share
    from joined
)

select * from final
order by partition, prompt_id
