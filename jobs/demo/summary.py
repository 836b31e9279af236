"""The demo's closing summary, read back from the lake with SQL (not from the demo's counters).

Why from the lake: the point of the demo is that everything the buffer did is on disk and
queryable; a summary computed from the loop's own variables would prove nothing about that. The
same queries back the demo's tests. Lines stay within 80 columns, and every command and path it
prints runs as printed from the directory the demo was started in (jobs/demo/shell.py).

Evictions and evicted groups are two counts: one sample call can evict a group for two reasons
(stale *and* zero variance), which records two evictions of one group. The summary gives both,
each under its own name, so the per-reason figures are never read as groups.

What staleness cost is two more counts: the groups generated again because a group was evicted
as stale (and for no other reason: a stale group with zero variance would have been replaced
anyway), read from the refills' ``replaces``; and the rows trained masked (``--strategy mask``:
selected with reason ``stale``, loss switched off). `drop` pays the first, `mask` the second,
`admit` and `wait` neither.
"""
from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from jobs.demo.shell import pasteable, program

WIDTH = 80
REASONS = ("stale", "zero_variance", "failure")


@dataclass
class LakeSummary:
    """Facts of one demo run, all computed by SQL over its lake."""

    steps: int
    trajectories: int
    groups: int
    trained_groups: int
    trained_trajectories: int
    evicted_groups: int = 0                # distinct groups with at least one eviction
    evictions: dict[str, int] = field(default_factory=dict)     # eviction decisions per reason
    staleness_mean: float = 0.0
    span_mean: float = 0.0
    two_version_trajectories: int = 0
    two_version_batches: int = 0
    stale_refills: int = 0                 # groups generated again for a stale-only eviction
    masked_groups: int = 0                 # groups trained masked (selected with reason stale)
    masked_rows: int = 0                   # their trajectories (non-padding)
    reward_first: float | None = None
    reward_last: float | None = None
    window: int = 10
    example_uid: str | None = None


def summarize(lake: str | Path, window: int = 10) -> LakeSummary:
    """Read the run back: batches, evicted groups and evictions per reason, staleness/span of
    trained rows, and the reward of everything generated in the first vs the last `window`
    dispatch steps."""
    from pipeline.analysis import connect

    con = connect(lake)

    def one(sql: str) -> tuple:
        rows = con.sql(sql).fetchall()
        return rows[0] if rows else ()

    steps, trained_groups, trained_trajs = one(
        "select count(*), coalesce(sum(n_groups), 0), coalesce(sum(n_trajectories), 0) "
        "from batches where partition = 'train'")
    (trajectories,) = one("select count(*) from trajectories")
    (groups,) = one("select count(*) from groups")
    evictions = dict(con.sql("select reason, count(*) from decisions where kind = 'evict' "
                             "group by reason order by reason").fetchall())
    (evicted_groups,) = one("select count(distinct (partition, uid)) from decisions "
                            "where kind = 'evict'")
    stal, span, two_traj, two_batches = one(
        "select avg(staleness), avg(span), count(*) filter (where span > 1), "
        "count(distinct batch_id) filter (where span > 1) "
        "from trajectory_fates where fate = 'sampled' and not is_padding")
    # a refill's `replaces` names the evicted groups it asked prompts for; one evicted as
    # stale and for nothing else is generation staleness alone cost (a refill whose refill_fn
    # raised served nothing: it has a refill_failed row of the same call and poll)
    (stale_refills,) = one(
        "with stale_only as (select partition, uid from decisions where kind = 'evict' "
        "group by partition, uid having bool_and(reason = 'stale')), "
        "served as (select r.partition, unnest(r.replaces) as uid from decisions as r "
        "where r.kind = 'refill' and not exists (select 1 from decisions as f "
        "where f.kind = 'refill_failed' and f.partition = r.partition "
        "and f.call_id = r.call_id and f.poll = r.poll)) "
        "select count(*) from served join stale_only using (partition, uid)")
    masked_groups, masked_rows = one(
        "select count(distinct (d.partition, d.batch_id, d.uid)), "
        "count(*) filter (where not p.is_padding) from decisions as d "
        "join provenance as p on p.partition = d.partition and p.batch_id = d.batch_id "
        "and p.uid = d.uid where d.kind = 'select' and d.reason = 'stale'")
    (last_step,) = one("select coalesce(max(global_steps), 0) from groups")
    first, last = one(
        f"select avg(reward) filter (where global_steps <= {int(window)}), "
        f"avg(reward) filter (where global_steps > {int(last_step) - int(window)}) "
        "from trajectory_fates")
    example = one("select uid from trajectory_fates where fate = 'sampled' and span > 1 "
                  "order by seq limit 1") or None
    return LakeSummary(
        steps=int(steps), trajectories=int(trajectories), groups=int(groups),
        trained_groups=int(trained_groups), trained_trajectories=int(trained_trajs),
        evicted_groups=int(evicted_groups),
        evictions={r: int(evictions.get(r, 0))
                   for r in [*REASONS, *sorted(set(evictions) - set(REASONS))]},
        staleness_mean=float(stal or 0.0), span_mean=float(span or 0.0),
        two_version_trajectories=int(two_traj or 0), two_version_batches=int(two_batches or 0),
        stale_refills=int(stale_refills), masked_groups=int(masked_groups),
        masked_rows=int(masked_rows or 0),
        reward_first=first, reward_last=last, window=window,
        example_uid=example[0] if example else None)


def try_commands(lake: str | Path, example_uid: str | None) -> list[tuple[str, list[str]]]:
    """Three `replaylake sql` commands worth running next: (what it shows, argv after
    `replaylake`). The tests run each of them; each answer fits a screen."""
    lake = str(lake)
    cmds = [
        ("evictions per reason (a group evicted for two reasons counts under both)",
         ["sql", "--lake", lake, "select reason, count(*) as evictions from decisions "
          "where kind = 'evict' group by reason order by evictions desc"]),
        ("the learning curve: reward of all rollouts per 50 weight versions",
         ["sql", "--lake", lake, "select max_global_steps // 50 * 50 as version, "
          "round(avg(reward), 3) as reward, count(*) as trajectories from trajectories "
          "group by version order by version"]),
    ]
    if example_uid:
        # three columns of `lineage`: one line per event, where all ten print a record each
        cmds.append(("the life of a group whose responses span two weight versions",
                     ["sql", "--lake", lake, "select stage, step, detail from "
                      f"lineage('{example_uid}')"]))
    else:
        cmds.append(("staleness of the last batches",
                     ["sql", "--lake", lake, "select step, n_groups, staleness_mean from batches "
                      "order by step desc limit 5"]))
    return cmds


def format_command(argv: list[str], indent: str = "  ", width: int = WIDTH, *,
                   prog: str = "replaylake") -> list[str]:
    """A shell command, `prog` then `argv`, as lines of at most `width` columns that still paste
    into bash: a SQL argument becomes a double-quoted block over several lines (SQL here never
    holds ``"``, ``$`` or backquotes), other breaks end with a backslash."""
    lines: list[str] = []
    cur = indent + prog
    for arg in argv:
        if " " in arg and not arg.startswith("uid="):
            lines.append(cur + ' "')
            words, row = arg.split(" "), indent + "  "
            for w in words:
                if len(row) + len(w) + 1 > width and row.strip():
                    lines.append(row.rstrip())
                    row = indent + "  "
                row += w + " "
            cur = row.rstrip() + '"'
            continue
        piece = " " + shlex.quote(arg)
        if len(cur) + len(piece) > width - 2:
            lines.append(cur + " \\")
            cur = indent + "   " + piece
        else:
            cur += piece
    lines.append(cur)
    return lines


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def render(s: LakeSummary, *, run_dir: Path, lake: Path, wandb_dir: Path | None,
           wall_s: float, cwd: Path | None = None) -> list:
    """The summary as lines of at most 80 characters (rich Text: markup in the headings only).
    Commands and paths are written to run from `cwd` (default: where the demo runs)."""
    from rich.text import Text

    ev = s.evictions
    by_reason = textwrap.wrap(", ".join(f"{r.replace('_', '-')} {ev.get(r, 0):,}" for r in ev),
                              width=WIDTH - 23) or ["none"]
    lines = [
        "[bold]What happened[/] (read back from the lake with SQL)",
        f"  steps                {s.steps} trained in {wall_s:.0f} s",
        f"  generated            {s.groups:,} prompt groups, {s.trajectories:,} trajectories",
        f"  trained on           {s.trained_groups:,} groups, {s.trained_trajectories:,} "
        "trajectories",
        f"  evicted groups       {s.evicted_groups:,} distinct (a group may be evicted for two "
        "reasons)",
        "  evictions by reason  " + by_reason[0],
        *("                       " + x for x in by_reason[1:]),
        f"  staleness            {s.staleness_mean:.2f} weight versions behind, on average "
        "(trained)",
        f"  staleness cost       {s.stale_refills:,} groups generated again (stale-only "
        "evictions),",
        f"                       {s.masked_groups:,} trained masked ({s.masked_rows:,} "
        "trajectories, loss off)",
        f"  span                 {s.span_mean:.3f} versions per trained trajectory; "
        f"{s.two_version_trajectories:,} of",
        f"                       them ({s.two_version_batches} of {s.steps} batches) straddle "
        "a weight update",
        f"  reward of rollouts   {_fmt(s.reward_first)} in the first {s.window} steps -> "
        f"{_fmt(s.reward_last)} in the last {s.window}",
        "",
        "[bold]Where to look[/]",
        f"  run directory  {pasteable(run_dir, cwd=cwd)}",
        f"  lake           {pasteable(lake, cwd=cwd)}",
    ]
    if wandb_dir is not None:
        # the run's own path, from where the user stands (like the lake's), in the command that
        # uploads it: too long for the column beside its label
        lines.append("  W&B run        offline, in the run directory; this uploads it:")
        lines.extend(format_command(["sync", pasteable(wandb_dir, cwd=cwd)], indent="    ",
                                    prog=program("wandb", cwd=cwd)))
    lines += ["", "[bold]Try[/]"]
    replaylake = program("replaylake", cwd=cwd)
    for what, argv in try_commands(pasteable(lake, cwd=cwd), s.example_uid):
        lines.append(f"  # {what}")
        lines.extend(format_command(argv, prog=replaylake))
    return [Text.from_markup(x) if x.startswith("[bold]") else Text(x) for x in lines]


def render_placement(placement: dict) -> list:
    """Where each piece of a ``--ray`` run ran: pid and Ray node id of the trainer (the driver),
    the buffer actor and each rollout actor (node ids shortened to 12 characters; summary.json
    holds them whole), and how many nodes and processes that is."""
    from rich.text import Text

    pieces = [("trainer (driver)", placement["driver"]), ("buffer actor", placement["buffer"]),
              *((f"rollout worker {i}", w) for i, w in enumerate(placement["rollout"]))]
    nodes = {p["node_id"] for _, p in pieces}
    pids = {p["pid"] for _, p in pieces}
    lines = [f"[bold]Where it ran[/] (Ray: {len(pids)} processes on {len(nodes)} "
             f"node{'s' if len(nodes) != 1 else ''})"]
    lines += [f"  {what:<21}pid {p['pid']:<8} node {p['node_id'][:12]}" for what, p in pieces]
    return [Text.from_markup(x) if x.startswith("[bold]") else Text(x) for x in lines]
