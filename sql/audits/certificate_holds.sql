-- name: certificate_holds
-- description: audit — every trained (non-padding) row whose group was trained at a group span
--   above the bound recorded with its selection (`certificates.over_bound`). Empty under `drop`
--   and `admit`; under `wait` it holds the finished groups that waited longer than the batches
--   took them, under `mask` the masked rows: what those strategies allow, which `replaylake
--   audit` counts apart instead of failing. Rows selected without a bound (unbounded runs,
--   lakes written before the bound was recorded) have nothing to break.
-- params: none
-- reads: certificates
-- returns: partition, step, batch_id, uid, seq, bound, strategy, group_span, staleness,
--   staleness_worst, token_staleness_max
with
trained as (
    select partition, step, batch_id, uid, seq, bound, strategy, group_span, staleness,
           staleness_worst, token_staleness_max, is_padding, over_bound
    from certificates
),

final as (
    select partition, step, batch_id, uid, seq, bound, strategy, group_span, staleness,
           staleness_worst, token_staleness_max
    from trained
    where over_bound and not is_padding
)

select * from final
order by partition, step, batch_id, seq
