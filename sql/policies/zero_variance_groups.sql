-- name: zero_variance_groups
-- description: the DAPO filter (SPEC §5.3): finished groups with more than one trajectory whose
--   metric values are all exactly equal (`zero_variance`, classified once when the group
--   finished), with that single value. Failure groups and validation partitions are exempt.
-- params: none
-- reads: candidates
-- returns: partition, uid, value
with
cands as (
    select partition, uid, global_steps, term_seq, status, n_traj, zero_variance, value
    from candidates
),

final as (
    select partition, uid, value, global_steps, term_seq
    from cands
    where status = 'finished' and n_traj > 1 and zero_variance and partition <> 'val'
)

select partition, uid, value from final
order by partition, global_steps, term_seq, uid
