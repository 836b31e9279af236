-- name: redispatch_lengths
-- description: response lengths of the sessions generated again after a restart against every
--   session generated, per partition: a restart that drops what was in flight re-generates the
--   long rollouts most (they are the ones still running), which biases what is trained next.
--   `sessions` is `re-dispatched` (rows of a group written after one of its `reissued` events,
--   the copies `resume` wrote of kept siblings aside) or `all` (every generated row once: the
--   copies aside, non-padding). n, then response_len mean, 10th / 50th / 90th percentile (of
--   the stored token counts, nearest rank) and max; a partition without re-dispatched sessions
--   has only its `all` row.
-- params: none
-- reads: group_events, trajectories
-- returns: partition, sessions, n, len_mean, len_p10, len_p50, len_p90, len_max
with
reissues as (
    select partition, uid, seq, kept_rows
    from group_events
    where event = 'reissued'
),
trajs as (
    select partition, uid, seq, n_response_tokens as response_len
    from trajectories
    where not is_padding
),

-- the copies a keeping re-issue wrote: the group's first kept_rows rows after the event
copies as (
    select t.partition, t.uid, t.seq
    from trajs as t
    join reissues as r on r.partition = t.partition and r.uid = t.uid and r.seq < t.seq
    where coalesce(r.kept_rows, 0) > 0
    qualify row_number() over (partition by r.partition, r.uid, r.seq order by t.seq)
        <= r.kept_rows
),
generated as (
    select t.*
    from trajs as t
    anti join copies as c on c.partition = t.partition and c.uid = t.uid and c.seq = t.seq
),
redone as (
    select g.*
    from generated as g
    semi join reissues as r on r.partition = g.partition and r.uid = g.uid and r.seq < g.seq
),
labelled as (
    select partition, 're-dispatched' as sessions, response_len from redone
    union all
    select partition, 'all' as sessions, response_len from generated
)

select
    partition,
    sessions,
    count(*) as n,
    avg(response_len) as len_mean,
    quantile_disc(response_len, 0.1) as len_p10,
    quantile_disc(response_len, 0.5) as len_p50,
    quantile_disc(response_len, 0.9) as len_p90,
    max(response_len) as len_max
from labelled
group by partition, sessions
order by partition, sessions desc
