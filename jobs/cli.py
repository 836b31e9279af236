"""The `replaylake` command line: one sub-command per job (each job module holds its own main).

Commands are registered lazily: listing them (`replaylake --help`) reads only the table below,
and running one imports only its own module. Job modules import numpy, polars, duckdb, torch or
the whole library, and paying for all of them on every call made `replaylake sql "select 1"` cost
seconds before any SQL ran. The one-line help of each command lives in the table so the listing
needs no import; tests check that it matches the command's docstring and that every command's
`--help` shows an example. Every command's failures go through one handler (`handled`): a user's
mistake is one `error:` line and exit 2, a bug a traceback and exit 1.
"""
from __future__ import annotations

import errno
import functools
import importlib
import inspect
import os
from collections.abc import Callable, Mapping
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
    # every command's user errors become one `error:` line and exit 2 (`handled`, below)
    info = CommandInfo(name=path.split()[-1], callback=handled(func), help=doc)
    cmd = get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode="rich")
    # a flag takes no value: without an empty metavar, help shows it a "<bool>" to type (the help
    # option is made on first use and then kept, so it is made here once)
    flags = [*cmd.params, cmd.get_help_option(click.Context(cmd))]
    for param in flags:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return cmd


# --- how a command's failure reaches its user -----------------------------------------------------
#
# One `error:` line and exit 2 for what the user can put right, a traceback and exit 1 only for a
# bug. Why one place: each command used to catch its own errors, each a different set, so the same
# mistake (a path that is not a lake, an unreadable segment, a read-only output directory, a full
# disk) printed one line in one command and a 40-line traceback in the next. Every command runs
# through `handled` (`build` wraps each one, `run` does the same for `python -m jobs.<name>`),
# which turns into an `error:` line every error replaylake raises on purpose (`ReplayLakeError`:
# bad input, not a lake, damage) except `InvariantError`, a bug by definition; and every `OSError`
# whose errno says the file system refused (a missing path, a file where a directory belongs or the
# other way round, a permission, a read-only file system, a full disk or quota, a file-size limit,
# an I/O error of the device), naming the file and what to do. Anything else keeps its traceback:
# that is what a bug report needs.

USER_EXIT = 2

# errno -> what to do about it (None: the OS's own words say it all)
_HINTS: dict[int, str | None] = {
    errno.ENOENT: None, errno.ENOTDIR: None, errno.EISDIR: None, errno.EEXIST: None,
    errno.ENAMETOOLONG: None, errno.ELOOP: None,
    errno.EACCES: "change its permissions, or run as a user who may",
    errno.EPERM: "change its permissions, or run as a user who may",
    errno.EROFS: "write somewhere else",
    errno.ENOSPC: "free space there (or write somewhere else) and run it again",
    errno.EDQUOT: "free space within the quota (or write somewhere else) and run it again",
    errno.EFBIG: "the file would pass the file-size limit: raise it (ulimit -f) or write "
                 "somewhere else",
    errno.EIO: "the device reported an I/O error: check it (dmesg) before trusting what is on it",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENFILE: "too many open files on the system",
    errno.ESTALE: "the network file system lost the file: remount and run it again",
}


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is something the user can put right (see the comment above)."""
    from pipeline.errors import InvariantError, ReplayLakeError
    if isinstance(exc, InvariantError):
        return False
    if isinstance(exc, ReplayLakeError):
        return True
    return isinstance(exc, OSError) and exc.errno in _HINTS


def message(exc: BaseException) -> str:
    """The one line a user error prints (without the `error: ` prefix)."""
    from pipeline.errors import ReplayLakeError
    if isinstance(exc, ReplayLakeError) or not isinstance(exc, OSError):
        return str(exc)
    what = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    where = [os.fsdecode(f) for f in (exc.filename, exc.filename2) if f is not None]
    if where:
        text = f"{what}: {' -> '.join(where)}"
    else:      # pyarrow's and others' errors carry the errno but no file name: keep their words
        detail = (exc.strerror or str(exc)).split(" Detail: ")[0].strip().rstrip(".")
        text = what if detail.lower() == what else f"{what} ({detail})"
    hint = _HINTS.get(exc.errno)
    return f"{text}; {hint}" if hint else text


def handled(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a command) with its user errors turned into one `error:` line and exit 2."""
    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if not is_user_error(exc):
                raise
            typer.echo(f"error: {message(exc)}", err=True)
            raise typer.Exit(USER_EXIT) from exc
    return command


def run(func: Callable[..., Any]) -> None:
    """`typer.run` of a command through `handled` (a job's `python -m` entry)."""
    typer.run(handled(func))


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
