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
-- reads: restart_rows
-- returns: partition, sessions, n, len_mean, len_p10, len_p50, len_p90, len_max
with
generated as (
    select partition, response_len, redone
    from restart_rows
    where not is_copy and not is_padding
),
labelled as (
    select partition, 're-dispatched' as sessions, response_len from generated where redone
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
