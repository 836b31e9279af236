-- name: dispatch_capacity
-- description: admission control: how many more groups the rollout side may dispatch now, at
--   trainer step `step` (the new groups registered with global_steps = step), so that none of
--   them can exceed the staleness bound before it is trained, when the trainer takes
--   `batch_size` groups per step, oldest dispatch first. A group registered at step g and
--   trained at step s has group span s - g + 1, kept while <= threshold: it must be trained at
--   one of the steps g .. g + threshold - 1, which hold threshold x batch_size places. Taken
--   already: the groups selected at steps >= `step` (n_selected: step g's batch when it was
--   sampled before the ask). Ahead of a new group: every buffered (sampleable) and in-flight
--   (pending or running) group, all dispatched at `step` or before (n_sampleable, n_inflight;
--   groups of the same step count too: the tie may go either way). Run it over the candidates
--   that survived eviction (as select_oldest); over the lake's `candidates` view, groups the
--   next poll will evict still count, which errs on the safe side. So
--   capacity = max(0, threshold x batch_size - n_selected - n_sampleable - n_inflight).
--   Evicted groups leave both counts, so an eviction frees a place. The guarantee assumes
--   every group finishes before the next step's sample (a group still in flight is passed
--   over by younger finished ones). A partition with none of these groups has no row (its
--   capacity is threshold x batch_size). The live buffer compiles the `capacity` item of the
--   step `final` over its own counts of the three.
-- params: step BIGINT, threshold BIGINT, batch_size BIGINT
-- reads: inflight, candidates, decisions
-- returns: partition, n_selected, n_sampleable, n_inflight, capacity
with
flying as (
    select partition, uid from inflight where status in ('pending', 'running')
),
buffered as (
    select partition, uid from candidates
),
taken as (
    select partition, uid from decisions where kind = 'select' and step >= $step
),

counted as (
    select
        partition,
        count(*) filter (where what = 'selected') as n_selected,
        count(*) filter (where what = 'sampleable') as n_sampleable,
        count(*) filter (where what = 'inflight') as n_inflight
    from (
        select partition, 'selected' as what from taken
        union all
        select partition, 'sampleable' as what from buffered
        union all
        select partition, 'inflight' as what from flying
    )
    group by partition
),
final as (
    select
        partition, n_selected, n_sampleable, n_inflight,
        greatest($threshold * $batch_size - n_selected - n_sampleable - n_inflight, 0)
            as capacity
    from counted
)

select partition, n_selected, n_sampleable, n_inflight, capacity
from final
order by partition
