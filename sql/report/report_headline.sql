-- name: report_headline
-- description: the headline numbers of a run between trainer steps `first_step` and
--   `last_step` (inclusive), per partition: the steps that trained, batches, trained
--   trajectories and response tokens (non-padding), staleness (mean, max, weighted by response
--   tokens) and span (mean, max) of those trajectories; groups dispatched in the window, and
--   groups trained, evicted (of which by the zero-variance filter) and discarded by a decision
--   in the window; groups dispatched in the window that are still live.
-- params: first_step BIGINT, last_step BIGINT
-- reads: provenance, groups, decisions
-- returns: partition, first_step, last_step, batches, trajectories, response_tokens,
--   staleness_mean, staleness_max, token_staleness_mean, span_mean, span_max, groups_dispatched,
--   groups_trained, groups_evicted, groups_filtered, groups_discarded, groups_live
with
trained as (
    select partition, step, staleness, span, n_response_tokens
    from provenance
    where not is_padding and step between $first_step and $last_step
),
handed_out as (
    select distinct partition, batch_id
    from decisions
    where kind = 'select' and step between $first_step and $last_step
),
grps as (
    select partition, uid, global_steps, fate, fate_step from groups
),
filtered as (
    select partition, uid
    from decisions
    where kind = 'evict' and reason = 'zero_variance' and step between $first_step and $last_step
),

partitions as (
    select partition from grps
    union
    select partition from handed_out
),
per_rows as (
    select
        partition,
        min(step) as first_step,
        max(step) as last_step,
        count(*) as trajectories,
        coalesce(sum(n_response_tokens), 0)::bigint as response_tokens,
        avg(staleness) as staleness_mean,
        max(staleness) as staleness_max,
        sum(staleness::hugeint * n_response_tokens) / nullif(sum(n_response_tokens), 0)
            as token_staleness_mean,
        avg(span) as span_mean,
        max(span) as span_max
    from trained
    group by partition
),
per_batches as (
    select partition, count(*) as batches from handed_out group by partition
),
per_groups as (
    select
        partition,
        count(*) filter (where global_steps between $first_step and $last_step)
            as groups_dispatched,
        count(*) filter (where fate = 'sampled' and fate_step between $first_step and $last_step)
            as groups_trained,
        count(*) filter (where fate = 'evicted' and fate_step between $first_step and $last_step)
            as groups_evicted,
        count(*) filter (where fate = 'discarded'
                         and fate_step between $first_step and $last_step) as groups_discarded,
        count(*) filter (where fate = 'live' and global_steps between $first_step and $last_step)
            as groups_live
    from grps
    group by partition
),
per_filtered as (
    select partition, count(distinct uid) as groups_filtered from filtered group by partition
),

final as (
    select
        p.partition,
        r.first_step,
        r.last_step,
        coalesce(b.batches, 0) as batches,
        coalesce(r.trajectories, 0) as trajectories,
        coalesce(r.response_tokens, 0) as response_tokens,
        r.staleness_mean,
        r.staleness_max,
        r.token_staleness_mean,
        r.span_mean,
        r.span_max,
        coalesce(g.groups_dispatched, 0) as groups_dispatched,
        coalesce(g.groups_trained, 0) as groups_trained,
        coalesce(g.groups_evicted, 0) as groups_evicted,
        coalesce(f.groups_filtered, 0) as groups_filtered,
        coalesce(g.groups_discarded, 0) as groups_discarded,
        coalesce(g.groups_live, 0) as groups_live
    from partitions as p
    left join per_rows as r on r.partition = p.partition
    left join per_batches as b on b.partition = p.partition
    left join per_groups as g on g.partition = p.partition
    left join per_filtered as f on f.partition = p.partition
)

select * from final
order by partition
