-- name: lake_coverage
-- description: what the lake's trajectories hold of what a report shows, per partition: rows
--   (padding included), rows with a reward known (not null) and response tokens counted. A
--   lake whose producer sent neither the tokens nor their count has every `n_response_tokens`
--   0, one written in the verl adapter's `decisions` mode no rewards (all null): the report
--   then says its length, token and reward figures are not the run's.
-- params: none
-- reads: trajectories
-- returns: partition, n_rows, n_rewards, response_tokens
select
    partition,
    count(*) as n_rows,
    count(reward) as n_rewards,
    coalesce(sum(n_response_tokens), 0)::bigint as response_tokens
from trajectories
group by partition
order by partition
