"""The `replaylake` command line: one sub-command per job (each job module holds its own main).

Commands are registered lazily: listing them (`replaylake --help`) reads the job files' text
and imports none of them, and running one imports only its own module. Job modules import numpy,
polars, duckdb, torch or the whole library, and paying for all of them on every call made
`replaylake sql "select 1"` cost seconds before any SQL ran. Each command's help is its job
function's docstring, the one copy: the listing shows its first paragraph, `--help` the whole of
it, examples included. Every command's failures go through one handler (`handled`): a user's
mistake is one `error:` line and exit 2, a bug a traceback and exit 1.
"""
from __future__ import annotations

import ast
import contextlib
import errno
import functools
import importlib
import inspect
import itertools
import os
import shutil
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import click
import typer
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_from_info
from typer.models import CommandInfo


@dataclass(frozen=True)
class Job:
    """A sub-command: the function ``func`` of the job module ``module``."""

    module: str
    func: str = "main"

    @property
    def help(self) -> str:
        """The line the listing shows: the first paragraph of the function's docstring."""
        return " ".join(docstring(self).split("\n\n")[0].split())


# "group command" -> Job. Adding a command is one line here; the first words name its groups.
# What users run is at the top level; `dev` holds what maintainers run (benchmarks, which also
# rewrite the docs' tables, the crash soak, the GPU check).
COMMANDS: dict[str, Job] = {
    "demo": Job("jobs.demo.main"),
    "sql": Job("jobs.sql.main"),
    "whatif": Job("jobs.whatif"),
    "audit": Job("jobs.audit"),
    "export": Job("jobs.export.main"),
    "compact": Job("jobs.compact"),
    "retain": Job("jobs.retain"),
    "report": Job("jobs.report"),
    "lake check": Job("jobs.lake_tool", "check"),
    "lake salvage": Job("jobs.lake_tool", "salvage"),
    "dev soak": Job("jobs.dev.soak"),
    "dev resume-harness": Job("jobs.dev.resume_harness"),
    "dev big-lake": Job("jobs.dev.big_lake"),
    "dev gpu-check": Job("jobs.dev.gpu_check"),
    "dev bench ingest": Job("jobs.bench.ingest"),
    "dev bench decide": Job("jobs.bench.decide"),
    "dev bench torch": Job("jobs.bench.to_torch"),
    "dev bench verl": Job("jobs.bench.verl"),
    "dev bench ray": Job("jobs.bench.ray"),
    "dev bench sql-memory": Job("jobs.bench.sql_memory"),
    "dev bench memory": Job("jobs.bench.memory"),
    "dev bench load": Job("jobs.bench.load"),
    "dev bench all": Job("jobs.bench.all"),
    "dev bench table": Job("jobs.bench.table"),
    "dev bench check": Job("jobs.bench.check"),
}

GROUPS: dict[str, str] = {
    "lake": "Lake maintenance: find damage, set it aside.",
    "dev": "Maintainer tools: benchmarks, the crash soak, the resume harness, the GPU check.",
    "dev bench": "Benchmarks (figures side by side with the reference, written to a file).",
}

# A first word that used to be a command or group -> where it lives now. Typed the old way, it is
# refused naming the new spelling, so a script or a habit learns where the command went.
MOVED: dict[str, str] = {"bench": "dev bench", "soak": "dev soak"}

HELP = "replaylake: a replay buffer for async LLM RL, on Arrow tables."


def docstring(job: Job) -> str:
    """The docstring of ``job``'s function, read from its source file without importing it.

    Why not import: job modules import numpy, polars, duckdb, torch or the whole library, and a
    listing that imported them all made `replaylake --help` cost seconds. Reading the text keeps
    one copy of each command's help, in the job itself."""
    tree = _parsed(_source(job.module))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == job.func:
            return ast.get_docstring(node) or ""
    raise LookupError(f"{job.module} has no function {job.func!r}")


def _source(module: str) -> Path:
    """The file of a job module (`jobs.x.y` -> jobs/x/y.py), found without importing packages."""
    base = Path(__file__).resolve().parent.joinpath(*module.split(".")[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


@functools.cache
def _parsed(path: Path) -> ast.Module:
    text = path.read_text(encoding="utf-8")
    try:
        return ast.parse(text, filename=str(path))
    except SystemError as exc:
        # CPython 3.11's AST builder keeps its recursion count in shared state and can raise a
        # spurious "AST constructor recursion depth mismatch" when another thread of the
        # process parses at the same moment (python/cpython gh-106905; seen once in a test
        # worker). The text is fine: parse it again.
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(text, filename=str(path))


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
    info = CommandInfo(name=path.split()[-1], callback=handled(func), help=doc, cls=_Command)
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
# that is what a bug report needs. A mistake on the command line itself (a missing option, a value
# that does not parse, an unknown command) is click's to find, before or around the job: every
# group and `run` turn it into the same one line (`_OneLineUsage`), not click's usage box.

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


def fail(text: str) -> NoReturn:
    """Print ``text`` as the one `error:` line of a user's mistake and exit 2."""
    typer.echo(f"error: {text}", err=True)
    raise typer.Exit(USER_EXIT)


# the lake a command reads or maintains, given as its LAKE argument or with --lake (`one_lake`)
LakeArg = Annotated[Path | None, typer.Argument(
    metavar="LAKE", help="the lake directory (or give --lake)", show_default=False)]
LakeOpt = Annotated[Path | None, typer.Option(
    "--lake", metavar="DIR", help="the lake directory (same as LAKE)")]


def one_lake(command: str, positional: Path | None, option: Path | None) -> Path:
    """The lake a command was given (`LakeArg` / `LakeOpt`): as its LAKE argument or with
    --lake, both alike; refused when missing or named twice differently."""
    if positional is None and option is None:
        fail(f"missing the lake: `replaylake {command} LAKE` or `--lake LAKE` "
             f"(try: replaylake {command} --help)")
    if positional is not None and option is not None and positional != option:
        fail(f"name the lake once: `replaylake {command} LAKE` or `--lake LAKE`")
    return positional or option     # type: ignore[return-value]


def terminal_width() -> int:
    """The terminal's width in columns: 80 when it has none, 40 at least."""
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def echo_wrapped(text: str, first: str = "", rest: str = "  ") -> None:
    """Print ``text`` wrapped to the terminal's width, its first line after ``first`` and the
    others after ``rest``; words and paths are never cut (a printed command stays runnable)."""
    typer.echo(textwrap.fill(text, terminal_width(), initial_indent=first, subsequent_indent=rest,
                             break_long_words=False, break_on_hyphens=False))


def handled(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a command) with its user errors turned into one `error:` line and exit 2."""
    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if not is_user_error(exc):
                raise
            fail(message(exc))     # raised inside `except`: the cause stays in __context__
    return command


def usage_line(exc: UsageError) -> str:
    """The one line of a usage mistake (a missing or malformed option, an unknown command),
    ending with where to read the command's options: click's own report is a usage box of
    several lines, unlike every other error of replaylake."""
    if isinstance(exc, typer.BadParameter) and exc.param is None and exc.param_hint is None:
        text = exc.message                  # a job's own words already name the option
    else:
        text = exc.format_message()
    text = " ".join(text.split()).rstrip(".")
    if text[:2].istitle():                  # "Missing option" -> "missing option"; not "SQL"
        text = text[0].lower() + text[1:]
    where = exc.ctx.command_path if exc.ctx is not None else "replaylake"
    return f"{text} (try: {where} --help)"


class _OneLineUsage:
    """Turns click's usage errors (raised while parsing a command line or running a command)
    into one `error:` line and exit 2. `--help`, and a group run without a command (which shows
    its help the same way), are left as they are."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _usage_errors():
            return super().make_context(*args, **kwargs)      # type: ignore[misc]

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors():
            return super().invoke(ctx)                         # type: ignore[misc]


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    try:
        yield
    except NoArgsIsHelpError:
        raise
    except UsageError as exc:      # typer's own copy of click's, which its commands raise
        fail(usage_line(exc))


class _Command(TyperCommand):
    """A job's command: a usage error of its own command line (an option missing its value,
    which click's parser raises knowing no command) names it, so the line ends with
    `replaylake <command> --help`, not the top level's."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except (UsageError, click.UsageError) as exc:
            if exc.ctx is None:
                exc.ctx = ctx
            raise


class _RunCommand(_OneLineUsage, _Command):
    """A job's command under `python -m jobs.<name>` (see `run`)."""


def run(func: Callable[..., Any]) -> None:
    """`typer.run` of a command through `handled` (a job's `python -m` entry), its usage errors
    one line as under `replaylake`."""
    app = typer.Typer(add_completion=False)
    app.command(cls=_RunCommand)(handled(func))
    app()


class _Listed(TyperCommand):
    """Stands in for a command in listings: its name and one line, nothing imported.

    The line is read from the job's file only when a listing asks for it: running a command
    builds the placeholders of all its siblings, and should not read their files."""

    def __init__(self, name: str, path: str) -> None:
        self.path = path
        super().__init__(name=name)

    @property                                   # type: ignore[override]
    def help(self) -> str:
        return COMMANDS[self.path].help

    @help.setter
    def help(self, value: str | None) -> None:  # click's __init__ sets it; the job's line wins
        pass

    short_help = help


class LazyGroup(_OneLineUsage, TyperGroup):
    """A group whose commands are imported only when one of them runs.

    Listing (help, typo suggestions) uses `_Listed` placeholders; `resolve_command`, which click
    calls only to run a command or show its own help, swaps in the real one."""

    prefix = ""

    def __init__(self, *, commands: Mapping[str, Any] | None = None, **kw: Any) -> None:
        super().__init__(commands=dict(_members(self.prefix)), **kw)

    def get_help_option(self, ctx: Any) -> Any:
        # as for a command's flags (`build`): --help takes no value, so no "<bool>" beside it
        option = super().get_help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        if not self.prefix and args and args[0] in MOVED:
            words = list(itertools.takewhile(lambda a: not a.startswith("-"), args))
            old, new = " ".join(words), " ".join([MOVED[args[0]], *words[1:]])
            fail(f"`replaylake {old}` is now `replaylake {new}`")
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
            group = f"{prefix} {name}".strip()
            sub = type("LazyGroup", (LazyGroup,), {"prefix": group})
            out[name] = sub(name=name, help=GROUPS[group], no_args_is_help=True,
                            rich_markup_mode="rich")
    return out


app = typer.Typer(cls=LazyGroup, help=HELP, no_args_is_help=True, add_completion=False)


@app.callback()
def _root() -> None:
    """replaylake: a replay buffer for async LLM RL, on Arrow tables."""


if __name__ == "__main__":
    app()
