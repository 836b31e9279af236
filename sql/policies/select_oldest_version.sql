-- name: select_oldest_version
-- description: selection: per partition, the batch_size candidates whose oldest weight version
--   is oldest first (min_version, the smallest min_global_steps of the group's trajectories),
--   so the group nearest to going stale is trained before a rule must evict it. A group
--   without trajectories has no version and is keyed by its dispatch step. Ties go to the
--   earlier terminal status arrival seq, then the uid: the order is total.
-- params: batch_size BIGINT
-- reads: candidates
-- returns: partition, uid, order_key, term_seq, rank
with
cands as (
    select partition, uid, global_steps, term_seq, min_version from candidates
),

checked as (
    select case when $batch_size > 0 then $batch_size
                else error('select_oldest_version: batch_size must be > 0, got ' || $batch_size)
           end as batch_size
),
-- the key: fixed once a group is terminal (it reads only the group's aggregates)
keyed as (
    select
        partition,
        uid,
        term_seq,
        coalesce(min_version, global_steps)::bigint as order_key
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
