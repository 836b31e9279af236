"""The `replaylake` command line: one sub-command per job (each job module holds its own main).

Commands are registered lazily: listing them (`replaylake --help`) reads only the table below,
and running one imports only its own module. Job modules import numpy, polars, duckdb, torch or
the whole library, and paying for all of them on every call made `replaylake sql "select 1"` cost
seconds before any SQL ran. The one-line help of each command lives in the table so the listing
needs no import; tests check that it matches the command's docstring and that every command's
`--help` shows an example.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click
import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_from_info
from typer.models import CommandInfo


@dataclass(frozen=True)
class Job:
    """A sub-command: the function ``func`` of ``module``, and the one line the listing shows
    (the first paragraph of the function's docstring)."""

    module: str
    func: str
    help: str


# "group command" -> Job. Adding a command is one line here; a group is the first word.
COMMANDS: dict[str, Job] = {
    "demo": Job("jobs.demo", "main",
                "Train a tiny GRU policy with asynchronous GRPO through replaylake (about a minute "
                "on 2 CPU cores), tracked in W&B offline; then see what happened with SQL over the "
                "lake."),
    "sql": Job("jobs.sql_query", "main",
               "Read-only SQL over a lake: one-shot, a named query, or an interactive shell."),
    "whatif": Job("jobs.whatif", "main",
                  "Replay a recorded run with other settings; print batches, evictions and "
                  "staleness."),
    "audit": Job("jobs.audit", "main",
                 "Run every audit query over a lake; exit code 1 when any audit finds a "
                 "violation."),
    "soak": Job("jobs.soak", "main",
                "Kill the buffer at every lake write point, and compaction and retention at "
                "theirs, many times over; exit 1 on any broken restart or reader."),
    "export": Job("jobs.export", "main",
                  "Export the trained data of chosen steps/partitions as shards with a manifest "
                  "(resumable)."),
    "compact": Job("jobs.compact", "main",
                   "Compact every sealed segment of a lake into Parquet (safe while a buffer "
                   "writes)."),
    "retain": Job("jobs.retain", "main",
                  "Physically drop the token payload of groups gone for more than STEPS steps."),
    "report": Job("jobs.report", "main",
                  "Write an HTML report of a run's staleness, evictions, occupancy and selection "
                  "bias."),
    "bench ingest": Job("jobs.bench_ingest", "main",
                        "Ingest throughput in memory, with the lake, and with the lake + fsync."),
    "bench decide": Job("jobs.bench_decide", "main",
                        "Decision latency at several buffer sizes, ours vs the naive reference, "
                        "same process."),
    "bench torch": Job("jobs.bench_torch", "main",
                       "Materialisation time of padded and packed tensors vs memcpy of the same "
                       "bytes."),
    "bench verl": Job("jobs.bench_verl", "main",
                      "verl's ReplayBufferAsync vs replaylake's adapter through TransferQueue, "
                      "same run."),
    "bench ray": Job("jobs.bench_ray", "main",
                     "Ray actor vs in-process: per-call put/sample latency, and sample "
                     "throughput."),
    "bench sql-memory": Job("jobs.bench_sql_memory", "main",
                            "Peak memory of a metadata query and a staleness aggregate on a large "
                            "lake, live and compacted, and the compaction throughput."),
    "bench memory": Job("jobs.bench_memory", "main",
                        "Live RSS growth vs Arrow payload bytes, and what comes back after "
                        "release."),
    "bench load": Job("jobs.bench_load", "main",
                      "Sustained load: 8 producers, a trainer, SQL and compaction at once; then "
                      "every audit."),
    "bench all": Job("jobs.bench_all", "main",
                     "Every benchmark in one process; one JSON and one markdown table."),
    "bench table": Job("jobs.bench_table", "main",
                       "Regenerate the performance table and the README's summary from a "
                       "`bench all` JSON."),
    "lake check": Job("jobs.lake_tool", "check",
                      "List damaged, missing and torn files of a lake; exit code 1 when any is "
                      "damaged/missing."),
    "lake salvage": Job("jobs.lake_tool", "salvage",
                        "Quarantine what is damaged, keep every write that verifies (the lake "
                        "must be closed)."),
}

GROUPS: dict[str, str] = {
    "bench": "Benchmarks (figures side by side with the reference, written to a file).",
    "lake": "Lake maintenance: find damage, set it aside.",
}

HELP = "replaylake: a replay buffer for async LLM RL, on Arrow tables."


def load(path: str) -> Any:
    """The function a command runs (imports its module)."""
    job = COMMANDS[path]
    return getattr(importlib.import_module(job.module), job.func)


def build(path: str) -> TyperCommand:
    """The real click command of ``path``, built by typer from the job's function."""
    func = load(path)
    doc = inspect.getdoc(func) or ""
    summary, sep, rest = doc.partition("\n\n")
    if rest.startswith("Examples:\n"):
        # typer dedents everything after the summary by the margin of its lines after the first;
        # when that first line is the "Examples:" header, the examples would lose their indent
        doc = f"{summary}\n\n\n{rest}"
    info = CommandInfo(name=path.split()[-1], callback=func, help=doc)
    cmd = get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode="rich")
    # a flag takes no value: without an empty metavar, help shows it a "<bool>" to type (the help
    # option is made on first use and then kept, so it is made here once)
    flags = [*cmd.params, cmd.get_help_option(click.Context(cmd))]
    for param in flags:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return cmd


class _Listed(TyperCommand):
    """Stands in for a command in listings: its name and one line, nothing imported."""

    def __init__(self, name: str, path: str) -> None:
        super().__init__(name=name, short_help=COMMANDS[path].help, help=COMMANDS[path].help)
        self.path = path


class LazyGroup(TyperGroup):
    """A group whose commands are imported only when one of them runs.

    Listing (help, typo suggestions) uses `_Listed` placeholders; `resolve_command`, which click
    calls only to run a command or show its own help, swaps in the real one."""

    prefix = ""

    def __init__(self, *, commands: Mapping[str, Any] | None = None, **kw: Any) -> None:
        super().__init__(commands=dict(_members(self.prefix)), **kw)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if isinstance(cmd, _Listed) and name is not None:
            cmd = self.commands[name] = build(cmd.path)
        return name, cmd, rest


def _members(prefix: str) -> dict[str, Any]:
    """The commands and sub-groups directly under ``prefix`` ("" for the top level)."""
    out: dict[str, Any] = {}
    depth = len(prefix.split()) if prefix else 0
    for path in COMMANDS:
        words = path.split()
        if prefix and words[:depth] != prefix.split():
            continue
        name = words[depth]
        if len(words) == depth + 1:
            out[name] = _Listed(name, path)
        elif name not in out:
            sub = type("LazyGroup", (LazyGroup,), {"prefix": f"{prefix} {name}".strip()})
            out[name] = sub(name=name, help=GROUPS[name], no_args_is_help=True,
                            rich_markup_mode="rich")
    return out


app = typer.Typer(cls=LazyGroup, help=HELP, no_args_is_help=True, add_completion=False)


@app.callback()
def _root() -> None:
    """replaylake: a replay buffer for async LLM RL, on Arrow tables."""


if __name__ == "__main__":
    app()
