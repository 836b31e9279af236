-- name: group_fates
-- description: the fate of every registered group, in the words every reader uses: `sampled`,
--   `evicted` or `discarded` from its first terminal decision on, `live` while it has none.
--   With it: every reason it was evicted for (sorted, comma-joined), the batch it was selected
--   into, the step and seq of that decision (null while live), and the seq of its first
--   release. The seqs let a reader ask for a fate as of a point of the log (state_as_of) as
--   well as now (groups): the fate holds from `fate_seq` on, and the group is live before.
-- params: none
-- reads: group_events, decisions
-- returns: partition, uid, fate, reason, batch_id, fate_step, fate_seq, release_seq
with
registered as (
    select distinct partition, uid from group_events where event = 'registered'
),
fate_rows as (
    select partition, uid, kind, reason, batch_id, step, seq
    from decisions
    where kind in ('select', 'evict', 'discard', 'release') and uid is not null
),

firsts as (
    select
        partition,
        uid,
        arg_min(kind, seq) filter (where kind <> 'release') as first_kind,
        string_agg(distinct reason, ',' order by reason) filter (where kind = 'evict') as reason,
        arg_min(batch_id, seq) filter (where kind = 'select') as batch_id,
        arg_min(step, seq) filter (where kind <> 'release') as fate_step,
        min(seq) filter (where kind <> 'release') as fate_seq,
        min(seq) filter (where kind = 'release') as release_seq
    from fate_rows
    group by partition, uid
),

final as (
    select
        r.partition,
        r.uid,
        case f.first_kind when 'select' then 'sampled'
                          when 'evict' then 'evicted'
                          when 'discard' then 'discarded'
                          else 'live' end as fate,
        f.reason,
        f.batch_id,
        f.fate_step,
        f.fate_seq,
        f.release_seq
    from registered as r
    left join firsts as f on f.partition = r.partition and f.uid = r.uid
)

select * from final
order by partition, uid
