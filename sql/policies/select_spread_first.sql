-- name: select_spread_first
-- description: selection: per partition, the batch_size candidates with the widest spread of
--   the aggregated metric first (metric_max - metric_min: a group whose trajectories scored
--   alike teaches the policy little, one whose scores differ most teaches it most). The key is
--   that spread negated, so ascending order puts the widest first; a group without the metric
--   (no trajectory, or none carries it) has key 1 and comes after every spread. Ties go to the
--   earlier terminal status arrival seq, then the uid: the order is total.
-- params: batch_size BIGINT
-- reads: candidates
-- returns: partition, uid, order_key, term_seq, rank
with
cands as (
    select partition, uid, term_seq, metric_min, metric_max from candidates
),

checked as (
    select case when $batch_size > 0 then $batch_size
                else error('select_spread_first: batch_size must be > 0, got ' || $batch_size)
           end as batch_size
),
-- the key: fixed once a group is terminal (it reads only the group's aggregates); min - max
-- rather than -(max - min), so an equal pair gives +0.0 in both engines, never -0.0
keyed as (
    select
        partition,
        uid,
        term_seq,
        coalesce(metric_min - metric_max, 1.0)::double as order_key
    from cands
),
ranked as (
    select
        *,
        row_number() over (partition by partition order by order_key, term_seq, uid) as rank
    from keyed
),

final as (
    select r.partition, r.uid, r.order_key, r.term_seq, r.rank
    from ranked as r, checked as c
    where r.rank <= c.batch_size
)

select * from final
order by partition, rank
