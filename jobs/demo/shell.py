"""What the demo prints for the user's shell: commands and paths that run as printed, from the
directory the demo was started in.

Why full paths and not "activate the venv first": `make run` installs replaylake into `.venv`
and runs it from there without activating anything, so a bare `replaylake` in a suggestion is
`command not found` in the user's shell. An activation line would fix that only for someone
who reads it, runs it, and uses a shell it was written for (bash, fish and csh each need
another); a command that names its program by path pastes as is, in any of them. When the
program on the user's PATH already is this install's (an activated venv, a user install),
the bare name is what runs, and the bare name is printed.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sysconfig
from pathlib import Path


def program(name: str, *, scripts: str | os.PathLike | None = None,
            cwd: str | os.PathLike | None = None, path: str | None = None) -> str:
    """The shell word that runs the console script `name` of the running installation.

    `scripts` is where the installation keeps its console scripts (default: the running
    interpreter's, e.g. ``.venv/bin``), `cwd` where the user stands (default: here), `path`
    the user's ``PATH`` (default: this process's). The bare name when ``PATH`` finds that very
    script (or when the installation has no such script: there is no better word to give);
    else the script's path, relative when it lies under `cwd` (``.venv/bin/replaylake``: a word
    with a slash is run as a path, no ``./`` needed), absolute otherwise, quoted for the shell.
    """
    script = Path(scripts if scripts is not None else sysconfig.get_path("scripts")) / name
    if not script.is_file():
        return name
    found = shutil.which(name, path=path if path is not None else os.environ.get("PATH", ""))
    if found is not None and os.path.samefile(found, script):
        return name
    return shlex.quote(pasteable(script, cwd=cwd))


def pasteable(target: str | os.PathLike, *, cwd: str | os.PathLike | None = None) -> str:
    """`target` as a path that works from `cwd`: relative when it lies under `cwd` (short, and
    the same form as the run directory the demo prints), absolute otherwise."""
    target = Path(target)
    here = Path(cwd) if cwd is not None else Path.cwd()
    if not target.is_absolute():
        return str(target)
    try:
        return str(target.relative_to(here.absolute()))
    except ValueError:
        pass
    try:                            # the same place reached through a symlink (macOS /tmp)
        return str(target.resolve().relative_to(here.resolve()))
    except (ValueError, OSError):
        return str(target)
