-- name: off_policy
-- description: the off-policy metrics of trained rows per partition and step, over non-padding
--   rows only (a step with none has no row): spans, staleness and worst staleness (mean, max,
--   min), staleness weighted by response tokens, and the exact per-token staleness where
--   version spans were reported (token-weighted sums in 128 bits, so no step below the ingest
--   limit overflows them). The live buffer compiles these aggregates for each batch; the
--   lake runs the file over the `provenance` view. `weights` names, for each metric, the
--   column counting what its mean was taken over, which merges the means of several batches.
-- params: none
-- weights: trajectory_spans by n_trajectories, trajectory_staleness by n_trajectories,
--   trajectory_staleness_worst by n_trajectories, token_staleness by n_response_tokens,
--   token_staleness_exact by n_span_tokens
-- reads: provenance
-- returns: partition, step, n_trajectories, trajectory_spans_mean, trajectory_spans_max,
--   trajectory_spans_min, trajectory_staleness_mean, trajectory_staleness_max,
--   trajectory_staleness_min, trajectory_staleness_worst_mean, trajectory_staleness_worst_max,
--   trajectory_staleness_worst_min, n_response_tokens, token_staleness_mean, n_span_tokens,
--   token_staleness_exact_mean, token_staleness_exact_max
select
    partition,
    step,
    count(*) as n_trajectories,
    avg(span) as trajectory_spans_mean,
    max(span) as trajectory_spans_max,
    min(span) as trajectory_spans_min,
    avg(staleness) as trajectory_staleness_mean,
    max(staleness) as trajectory_staleness_max,
    min(staleness) as trajectory_staleness_min,
    avg(staleness_worst) as trajectory_staleness_worst_mean,
    max(staleness_worst) as trajectory_staleness_worst_max,
    min(staleness_worst) as trajectory_staleness_worst_min,
    cast(sum(n_response_tokens) as bigint) as n_response_tokens,
    sum(staleness::hugeint * n_response_tokens) / nullif(sum(n_response_tokens), 0)
        as token_staleness_mean,
    cast(sum(span_tokens) as bigint) as n_span_tokens,
    sum(token_staleness_sum) / nullif(sum(span_tokens), 0) as token_staleness_exact_mean,
    max(case when span_tokens > 0 then token_staleness_max end) as token_staleness_exact_max
from provenance
where (
    not is_padding
)
group by partition, step
order by partition, step
