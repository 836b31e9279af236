-- name: select_oldest
-- description: selection: per partition, the batch_size oldest candidates by (global_steps,
--   terminal status arrival seq, uid) — run it over what survived eviction. The seq is unique,
--   so the order is total and a rerun picks the same groups (hash order never enters).
-- params: batch_size BIGINT
-- reads: candidates
-- returns: partition, uid, global_steps, term_seq, rank
with
cands as (
    select partition, uid, global_steps, term_seq from candidates
),

checked as (
    select case when $batch_size > 0 then $batch_size
                else error('select_oldest: batch_size must be > 0, got ' || $batch_size)
           end as batch_size
),
ranked as (
    select
        *,
        row_number() over (partition by partition order by global_steps, term_seq, uid) as rank
    from cands
),

final as (
    select r.partition, r.uid, r.global_steps, r.term_seq, r.rank
    from ranked as r, checked as c
    where r.rank <= c.batch_size
)

select * from final
order by partition, rank
