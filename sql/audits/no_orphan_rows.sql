-- name: no_orphan_rows
-- description: audit — every row of a group belongs to a registered group: a status event,
--   trajectory or decision naming a (partition, uid) that has no `registered` event is an
--   orphan. A group's rows are written after its registration and nothing removes one, so no
--   crash leaves an orphan, and readers refuse a lake that has some as damaged; only where
--   `replaylake lake salvage` set group events aside do they read on, and this audit still lists
--   the rows the lost registrations leave behind. One row per group and table.
-- params: none
-- reads: group_events, trajectories, decisions
-- returns: partition, uid, table_name, n_rows, first_seq
with
registered as (
    select distinct partition, uid from group_events where event = 'registered'
),
group_rows as (
    select 'group_events' as table_name, partition, uid, seq
    from group_events
    where event <> 'registered'
    union all
    select 'trajectories' as table_name, partition, uid, seq from trajectories
    union all
    select 'decisions' as table_name, partition, uid, seq from decisions where uid is not null
),

final as (
    select g.partition, g.uid, g.table_name, count(*) as n_rows, min(g.seq) as first_seq
    from group_rows as g
    left join registered as r on r.partition = g.partition and r.uid = g.uid
    where r.uid is null
    group by g.partition, g.uid, g.table_name
)

select * from final
order by partition, first_seq, table_name
