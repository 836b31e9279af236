-- name: whatif_figures
-- description: the headline figures of one run, as `replaylake whatif` compares a recorded run
--   with its replay: sample calls that handed out a batch, trained rows (non-padding rows of
--   selected groups), evictions (one per group and reason), the staleness of the trained rows
--   at their step (mean, max, and `token_staleness_exact_mean`: the exact mean per response
--   token over rows that report version spans, as in `off_policy`; not the response-length
--   weighted `token_staleness_mean` of `report_headline`), the trained rows "from the future"
--   (newest weight version not older than the step: a replay reaches them when it evicts more
--   than the recorded run did; a live run never trains one), the same staleness figures with
--   those rows counted at staleness 0 (floors: the least a live run could have trained them
--   at), and the trained rows whose group span was above the bound recorded with their
--   selection.
-- params: none
-- reads: batches, decisions, provenance, certificates
-- returns: batches, trained_rows, evicted, staleness_mean, staleness_max,
--   token_staleness_exact_mean, future_rows, staleness_mean_floor, staleness_max_floor,
--   token_staleness_exact_mean_floor, over_bound_rows
with
trained as (
    select staleness, token_staleness_sum, span_tokens, staleness < 0 as future
    from provenance
    where not is_padding
),

staleness as (
    select
        count(*) as trained_rows,
        avg(staleness) as staleness_mean,
        max(staleness) as staleness_max,
        sum(token_staleness_sum) / nullif(sum(span_tokens), 0) as token_staleness_exact_mean,
        count(*) filter (where future) as future_rows,
        avg(greatest(staleness, 0)) as staleness_mean_floor,
        max(greatest(staleness, 0)) as staleness_max_floor,
        sum(case when future then 0 else token_staleness_sum end)
            / nullif(sum(span_tokens), 0) as token_staleness_exact_mean_floor
    from trained
),

final as (
    select
        (select count(*) from batches) as batches,
        s.trained_rows,
        (select count(*) from decisions where kind = 'evict') as evicted,
        s.staleness_mean, s.staleness_max,
        s.token_staleness_exact_mean::double as token_staleness_exact_mean,
        s.future_rows, s.staleness_mean_floor, s.staleness_max_floor,
        s.token_staleness_exact_mean_floor::double as token_staleness_exact_mean_floor,
        (select count(*) from certificates where over_bound and not is_padding)
            as over_bound_rows
    from staleness as s
)

select * from final
