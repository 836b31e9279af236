-- name: lake_candidates
-- description: the candidate table of the lake's current state, as the live buffer holds it:
--   every terminal group not yet sampled, evicted or discarded, classified for the
--   zero-variance filter on `metric` (`reward`, or a named reward metric in reward_info):
--   zero_variance when finished with more than one trajectory and every value present and
--   exactly equal (value = that value). n_missing counts trajectories lacking the metric.
--   Feed it to the policy queries for what-if analysis. (Validation partitions never filter.)
-- params: metric VARCHAR
-- reads: groups, trajectories
-- returns: partition, uid, global_steps, term_seq, status, n_traj, zero_variance, value, n_missing
with
grps as (
    select partition, uid, global_steps, effective_status, term_seq, reissued_seq, n_traj, fate
    from groups
),
trajs as (
    select
        partition, uid, seq,
        case when $metric = 'reward' then reward else reward_info[$metric] end as metric
    from trajectories
),

terminal as (
    select * from grps
    where effective_status in ('finished', 'failure') and fate = 'live'
),
values_of as (
    select
        g.partition, g.uid,
        count(t.seq) as n,
        count(t.metric) as n_present,
        min(t.metric) as lo,
        max(t.metric) as hi
    from terminal as g
    left join trajs as t
        on t.partition = g.partition and t.uid = g.uid and t.seq > coalesce(g.reissued_seq, -1)
    group by g.partition, g.uid
),

final as (
    select
        g.partition, g.uid, g.global_steps, g.term_seq,
        g.effective_status as status,
        g.n_traj,
        g.effective_status = 'finished' and g.partition <> 'val' and v.n > 1
            and v.n_present = v.n and v.lo = v.hi as zero_variance,
        v.n - v.n_present as n_missing,
        v.lo as lo
    from terminal as g
    join values_of as v on v.partition = g.partition and v.uid = g.uid
)

select
    partition, uid, global_steps, term_seq, status, n_traj, zero_variance,
    case when zero_variance then lo end as value,
    n_missing
from final
order by partition, global_steps, term_seq, uid
