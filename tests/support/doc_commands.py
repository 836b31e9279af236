"""The shell lines of README.md and docs/*.md, and the check each one gets in the tests.

Every fenced block is read by its language: `bash` and `sh` blocks are commands (a line ending
in a backslash continues on the next), `console` blocks are transcripts (`$ ` lines are commands,
the lines under one are what it prints), `crontab` blocks are schedules (five time fields, then a
command; `NAME=value` lines set variables). Any other language is not a command.

A command runs as printed: through `bash -c`, in a fresh directory laid out as a user's checkout
is after `make run` (`runs/demo/latest/lake`, and `runs/tt/lake` from the README's time-travel
run), with `replaylake` on the PATH running this checkout's CLI. So a path, an option or a query
that does not work for a user does not work here either, and whatever a command writes lands in
that directory. A line that needs what a test machine does not have is marked in the doc with a
`# needs: WORD[, WORD]` comment (on the line, or on a line of its own that covers the rest of its
block; free text may follow a `;` or a parenthesis) and is only checked for its syntax: bash's
parser, and for `replaylake` the command's own argument parsing. `make` lines are never run:
their targets must exist in the Makefile.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# What a `# needs:` marker may name: what the test machines lack.
NEEDS = {
    "gpu": "a CUDA device",
    "vllm": "vLLM's own environment (`make test-vllm`)",
    "cluster": "a cluster (several machines, verl's trainer)",
    "network": "the network (a package index)",
    "minutes": "minutes of machine time (benchmarks, the soak, a full demo run)",
}
COMMAND_LANGS = ("bash", "sh", "console", "crontab")

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[^\s`]*)")
_MARKER = re.compile(r"(?:^|\s)#\s*needs:\s*(?P<words>[a-z]+(?:\s*,\s*[a-z]+)*)")
_CRON = re.compile(r"^(?:\S+\s+){5}(?P<command>.+)$")
_VARIABLE = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)=(?P<value>\S*)$")
TIMEOUT_S = 180
DEMO_RUN = "runs/demo/20261201-120000"      # a run directory as the demo names them


@dataclass(frozen=True)
class Block:
    """One fenced block: where it opens, its language and its lines (fence indent removed)."""

    doc: Path
    line: int                         # 1-based line of the opening fence
    lang: str
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """A command as a shell reads it (continuations joined), and what the doc says of it."""

    where: str                        # "docs/cli.md:28": the doc and the command's first line
    text: str
    needs: tuple[str, ...] = ()
    shown: str = ""                   # console blocks: what the doc prints under it
    env: dict[str, str] = field(default_factory=dict)   # crontab: the block's variables

    @property
    def first_word(self) -> str:
        words = shlex.split(self.text, comments=True)
        return words[0] if words else ""


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, in order."""
    out, lines = [], doc.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start, body = len(m["indent"]), i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        out.append(Block(doc, start, m["lang"], tuple(body)))
        i += 1
    return out


def python_blocks(doc: Path) -> list[str]:
    """The ```python blocks of ``doc``, in order, as source text (```py blocks are illustrations)."""
    return ["\n".join(b.lines) + "\n" for b in blocks(doc) if b.lang == "python"]


def needs_of(text: str) -> tuple[str, ...]:
    """The words of a `# needs:` comment in ``text`` (empty without one)."""
    m = _MARKER.search(text)
    return tuple(w.strip() for w in m["words"].split(",")) if m else ()


def commands(block: Block) -> list[Command]:
    """The commands of one block (none for a language that holds no commands)."""
    if block.lang in ("bash", "sh"):
        return _shell_commands(block)
    if block.lang == "console":
        return _console_commands(block)
    if block.lang == "crontab":
        return _cron_commands(block)
    return []


def _joined(lines: tuple[str, ...], i: int) -> tuple[str, int]:
    """The command starting at ``lines[i]`` with its backslash continuations, and the next index."""
    parts = [lines[i]]
    while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
        i += 1
        parts.append(lines[i])
    return "\n".join(parts), i + 1


def _shell_commands(block: Block) -> list[Command]:
    out, block_needs, i = [], (), 0
    while i < len(block.lines):
        line = block.lines[i]
        if not line.strip():
            i += 1
        elif line.lstrip().startswith("#"):
            block_needs = needs_of(line) or block_needs
            i += 1
        else:
            start = i
            text, i = _joined(block.lines, i)
            out.append(Command(f"{block.doc.relative_to(ROOT)}:{block.line + 1 + start}", text,
                               tuple(dict.fromkeys(block_needs + needs_of(text)))))
    return out


def _console_commands(block: Block) -> list[Command]:
    out, i = [], 0
    while i < len(block.lines):
        if not block.lines[i].startswith("$ "):
            i += 1
            continue
        start = i
        text, i = _joined(block.lines, i)
        shown = []
        while i < len(block.lines) and not block.lines[i].startswith("$ "):
            shown.append(block.lines[i])
            i += 1
        out.append(Command(f"{block.doc.relative_to(ROOT)}:{block.line + 1 + start}", text[2:],
                           needs_of(text), "\n".join(shown).strip("\n")))
    return out


def _cron_commands(block: Block) -> list[Command]:
    env: dict[str, str] = {}
    out = []
    for i, line in enumerate(block.lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if (var := _VARIABLE.match(line)) is not None:
            env[var["name"]] = var["value"]
        elif (job := _CRON.match(line)) is not None:
            out.append(Command(f"{block.doc.relative_to(ROOT)}:{block.line + 1 + i}",
                               job["command"], needs_of(line), env=dict(env)))
    return out


def doc_commands() -> list[Command]:
    """Every command of README.md and docs/*.md, in document order."""
    return [c for doc in DOCS for b in blocks(doc) for c in commands(b)]


# --- the checks -----------------------------------------------------------------------------


def make_targets() -> set[str]:
    """The targets the Makefile defines."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {t for m in re.finditer(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?!=)", text,
                                   re.M) for t in m[1].split()}


def argument_problem(argv: list[str]) -> str | None:
    """Why `replaylake` would refuse ``argv`` (the words after `replaylake`) before running
    anything, or None: the command is found as the CLI finds it and parses its arguments."""
    import typer

    from jobs import cli
    words = list(argv)
    path = next((" ".join(words[:n]) for n in range(len(words), 0, -1)
                 if " ".join(words[:n]) in cli.COMMANDS), None)
    if path is None:
        return f"`replaylake {' '.join(argv)}`: no such command"
    command = cli.build(path)
    try:
        command.make_context(f"replaylake {path}", words[len(path.split()):])
    except typer.Exit as done:               # --help and other eager options end parsing
        return None if done.exit_code == 0 else f"exit {done.exit_code}"
    except typer.TyperException as refused:  # a usage error of typer's parser, as the CLI's
        return getattr(refused, "format_message", refused.__str__)()
    return None


def syntax_problem(command: Command) -> str | None:
    """The check of a marked line: bash parses it and, for `replaylake`, the CLI accepts its
    arguments; a `make` line names targets the Makefile has."""
    unknown = [w for w in command.needs if w not in NEEDS]
    if unknown:
        return f"`# needs: {', '.join(unknown)}`: not a known need ({', '.join(NEEDS)})"
    res = subprocess.run(["bash", "-n", "-c", command.text], capture_output=True, text=True,
                         timeout=30)
    if res.returncode != 0:
        return f"bash cannot parse it: {res.stderr.strip()}"
    words = shlex.split(command.text, comments=True)
    if words and words[0] == "make":
        missing = [t for t in words[1:] if not t.startswith("-") and "=" not in t
                   and t not in make_targets()]
        return f"no Makefile target {', '.join(missing)}" if missing else None
    if words and words[0] == "replaylake":
        return argument_problem(words[1:])
    return None


class Sandbox:
    """The directory a doc command runs in: the lakes the docs name, laid out as a checkout is
    after `make run`, copied fresh for every command so that what one writes never reaches the
    next; and a `replaylake` on the PATH that runs this checkout's CLI."""

    def __init__(self, lakes: dict[str, Path]) -> None:
        self.lakes = lakes                             # path the docs use -> a lake to copy there
        self.root = Path(tempfile.mkdtemp(prefix="replaylake-doc-commands-"))
        self.bin = self.root / "bin"
        self.bin.mkdir()
        shim = self.bin / "replaylake"
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m jobs.cli "$@"\n')
        shim.chmod(0o755)
        self.count = 0

    def fresh(self) -> Path:
        """A new working directory holding a copy of every lake."""
        self.count += 1
        cwd = self.root / f"cwd{self.count:03d}"
        for rel, lake in self.lakes.items():
            shutil.copytree(lake, cwd / rel, symlinks=True)
        if (cwd / DEMO_RUN).is_dir():               # `latest` is a link, as the demo makes it
            (cwd / DEMO_RUN).with_name("latest").symlink_to(Path(DEMO_RUN).name)
        return cwd

    def env(self, cwd: Path, command: Command) -> dict[str, str]:
        env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "PYTHONPATH": str(ROOT),
               "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
               "REPLAYLAKE_SQL_HISTORY": str(cwd / ".sql_history"),
               "MPLCONFIGDIR": str(self.root / "matplotlib"), "WANDB_MODE": "offline"}
        for name, value in command.env.items():      # a crontab's lake variable: our lake
            env[name] = str(cwd / "runs/demo/latest/lake") if value.endswith("/lake") else value
        return env

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def readme_python(section: str) -> str:
    """The first Python block of the README section titled ``section``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split(f"{section}\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", text.split("\n## ", 1)[0], re.S)
    if code is None:
        raise LookupError(f"the README section {section!r} has no Python block")
    return code.group(1)


def make_lakes(root: Path) -> dict[str, Path]:
    """The lakes the docs' commands name, made under ``root``: a demo-like run (async, drop at
    threshold 2, DAPO filter, failures, late groups, a `val` partition; 20 steps, so the docs'
    step ranges exist) as `runs/demo/latest/lake`, and the README's time-travel run, executed
    as written, as `runs/tt/lake`."""
    from tests.support.sql_runs import simulate_async

    simulate_async(root / "demo" / "lake", steps=20)
    (root / "tt").mkdir()
    cwd = os.getcwd()
    os.chdir(root / "tt")
    try:
        exec(compile(readme_python("### Time travel, lineage and prompts"), "README.md", "exec"),
             {})   # noqa: S102 - our own README, run as a user would
    finally:
        os.chdir(cwd)
    return {f"{DEMO_RUN}/lake": root / "demo" / "lake", "runs/tt/lake": root / "tt" / "runs/tt/lake"}


def run_problem(command: Command, sandbox: Sandbox) -> str | None:
    """Run ``command`` as printed in a fresh sandbox directory; why it did not do what the doc
    says, or None. It must exit 0, or, where a console block shows an `error:` line under it,
    exit 2 printing exactly that line; never with a traceback."""
    cwd = sandbox.fresh()
    res = subprocess.run(["bash", "-c", command.text], cwd=cwd, env=sandbox.env(cwd, command),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    said = [x for x in (res.stderr or res.stdout).replace("\r", "\n").split("\n") if x.strip()]
    tail = "\n".join(said[-12:])                   # progress bars redraw with \r: one line each
    if "Traceback (most recent call last)" in res.stderr:
        return f"traceback:\n{tail}"
    if command.shown.startswith("error:"):
        expected = command.shown.split("\n", 1)[0]
        got = said[-1] if said else ""
        if res.returncode != 2 or got != expected:
            return f"the doc shows exit 2 with {expected!r}; got exit {res.returncode}: {tail}"
        return None
    if res.returncode != 0:
        return f"exit {res.returncode}:\n{tail}"
    return None


def check(command: Command, sandbox: Sandbox) -> str | None:
    """The check ``command`` gets: syntax only when marked or a `make` line, else a real run."""
    if command.needs or command.first_word == "make":
        return syntax_problem(command)
    return run_problem(command, sandbox)
