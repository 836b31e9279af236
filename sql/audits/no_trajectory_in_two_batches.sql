-- name: no_trajectory_in_two_batches
-- description: audit — exactly once into training: no trajectory (partition, uid, session_id,
--   index) is handed out in two batches, or twice in one. What a batch held is `batch_rows`:
--   the trajectories of each selected group's current incarnation that arrived before its
--   selection. A group is selected once and its keys are unique, so a repeat is a group
--   selected twice (see `no_group_in_two_batches`) or a trajectory stored twice (see
--   `no_trajectory_twice`) reaching the trainer.
-- params: none
-- reads: batch_rows, trajectories
-- returns: partition, uid, session_id, index, n_times, batch_ids
with
trained as (
    select partition, batch_id, seq from batch_rows
),
trajs as (
    select partition, uid, session_id, index, seq from trajectories
),

final as (
    select t.partition, t.uid, t.session_id, t.index, count(*) as n_times,
           list(b.batch_id order by b.batch_id) as batch_ids
    from trained as b
    join trajs as t on t.partition = b.partition and t.seq = b.seq
    group by t.partition, t.uid, t.session_id, t.index
    having count(*) > 1
)

select * from final
order by partition, uid, session_id, index
