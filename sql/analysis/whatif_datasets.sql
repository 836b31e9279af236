-- name: whatif_datasets
-- description: how one run shared training among datasets, as `replaylake whatif --compare`
--   prints it per policy: per partition and dataset (groups registered with one), the
--   non-padding trajectories generated and trained, each dataset's share of its partition's
--   generated and trained trajectories, and its starvation (the `starved_stretches` view:
--   stretches of consecutive steps with groups in flight but nothing trained, how many and the
--   longest). `saved_reason` as in whatif_waste (groups evicted for it were never generated).
-- params: saved_reason VARCHAR
-- reads: trajectory_fates, starved_stretches
-- returns: partition, dataset, generated_trajectories, trained_trajectories, generated_share,
--   trained_share, starved_stretches, longest_starved
with
rows as (
    select partition, dataset, fate = 'sampled' as trained
    from trajectory_fates
    where not is_padding and dataset is not null
      and not coalesce(fate = 'evicted' and $saved_reason <> ''
                       and list_contains(string_split(reason, ','), $saved_reason), false)
),
per_dataset as (
    select
        partition, dataset, count(*) as generated_trajectories,
        count(*) filter (where trained) as trained_trajectories
    from rows
    group by partition, dataset
),
starved as (
    select partition, dataset, count(*) as stretches, max(length) as longest
    from starved_stretches
    group by partition, dataset
),

final as (
    select
        p.partition, p.dataset, p.generated_trajectories, p.trained_trajectories,
        (p.generated_trajectories
            / sum(p.generated_trajectories) over (partition by p.partition))::double
            as generated_share,
        (p.trained_trajectories
            / nullif(sum(p.trained_trajectories) over (partition by p.partition), 0))::double
            as trained_share,
        coalesce(s.stretches, 0) as starved_stretches,
        coalesce(s.longest, 0) as longest_starved
    from per_dataset as p
    left join starved as s on s.partition = p.partition and s.dataset = p.dataset
)

select * from final
order by partition, dataset
