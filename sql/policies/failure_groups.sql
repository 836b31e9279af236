-- name: failure_groups
-- description: failure evictions (SPEC §5.4): mode `all` (async) flags every failure group,
--   mode `empty` (sync with sync_refill_failed_groups) only failures without any trajectory. A
--   finished group without trajectories is a failure. Validation partitions are exempt.
-- params: mode VARCHAR
-- reads: candidates
-- returns: partition, uid, n_traj
with
cands as (
    select partition, uid, global_steps, term_seq, status, n_traj from candidates
),

checked_mode as (
    select case when $mode in ('all', 'empty') then $mode
                else error('failure_groups: mode must be ''all'' or ''empty'', got ''' || $mode || '''')
           end as mode
),
failures as (
    select partition, uid, global_steps, term_seq, n_traj
    from cands
    where (status = 'failure' or n_traj = 0) and partition <> 'val'
),

final as (
    select f.partition, f.uid, f.n_traj, f.global_steps, f.term_seq
    from failures as f, checked_mode as m
    where m.mode = 'all' or f.n_traj = 0
)

select partition, uid, n_traj from final
order by partition, global_steps, term_seq, uid
