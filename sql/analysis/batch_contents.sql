-- name: batch_contents
-- description: the trajectories one batch handed to the trainer, rebuilt from the lake alone
--   (replaying the decision log): every trajectory of the groups selected into it, in arrival
--   order — the same rows, in the same order, as the live Batch.
-- params: batch_id BIGINT
-- reads: trajectory_fates
-- returns: partition, uid, session_id, index, seq, min_global_steps, max_global_steps, reward,
--   staleness
with
trained as (
    select partition, uid, session_id, index, seq, min_global_steps, max_global_steps, reward,
           staleness
    from trajectory_fates
    where fate = 'sampled' and batch_id = $batch_id
)

select * from trained
order by seq
