-- name: no_double_terminal
-- description: audit — a group turns terminal at most once and stays terminal: more than one
--   finished/failure event, or any status event after the first one (running, re-issue, ...),
--   is a violation. Returns the group's events from the first terminal one on.
-- params: none
-- reads: group_events
-- returns: partition, uid, n_after, events
with
events as (
    select partition, uid, event, seq from group_events
),

first_terminal as (
    select partition, uid, min(seq) as term_seq
    from events
    where event in ('finished', 'failure')
    group by partition, uid
),
after as (
    select e.partition, e.uid, e.event, e.seq
    from events as e
    join first_terminal as f on f.partition = e.partition and f.uid = e.uid
    where e.seq >= f.term_seq
),

final as (
    select partition, uid, count(*) - 1 as n_after, list(event order by seq) as events
    from after
    group by partition, uid
    having count(*) > 1
)

select * from final
order by partition, uid
