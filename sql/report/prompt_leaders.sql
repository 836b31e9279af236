-- name: prompt_leaders
-- description: the report's Prompts section: per partition, the `top` prompts (from the
--   `prompt_history` view, whole lake) on two boards. `wasteful`: the most response tokens
--   spent on groups that were never trained (evicted, discarded, partial rows a re-issue
--   dropped), at least one token. `solved`: prompts every response of which got the best
--   reward seen in the partition, the most responses generated for them first (generation a
--   solved prompt keeps taking). Ties go to the smaller prompt id; rank counts from 1.
-- params: top BIGINT
-- reads: prompt_history
-- returns: partition, board, rank, prompt_id, n_groups, trained, evicted, n_responses,
--   reward_mean, zero_variance_share, tokens_generated, tokens_wasted, wasted_share,
--   last_trained_step
with
prompts as (
    select partition, prompt_id, n_groups, trained, evicted, n_responses, reward_mean,
           zero_variance_share, tokens_generated, tokens_wasted, wasted_share,
           last_trained_step, solved
    from prompt_history
),

wasteful as (
    select
        'wasteful' as board,
        row_number() over (partition by partition
                           order by tokens_wasted desc, prompt_id) as rank,
        *
    from prompts
    where tokens_wasted > 0
),
solved as (
    select
        'solved' as board,
        row_number() over (partition by partition
                           order by n_responses desc, tokens_generated desc, prompt_id) as rank,
        *
    from prompts
    where solved
),

final as (
    select partition, board, rank, prompt_id, n_groups, trained, evicted, n_responses,
           reward_mean, zero_variance_share, tokens_generated, tokens_wasted, wasted_share,
           last_trained_step
    from (select * from wasteful union all select * from solved)
    where rank <= $top
)

select * from final
order by partition, board desc, rank
