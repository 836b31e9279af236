"""The progress bars of the lake jobs: on a terminal only.

A job's ``--progress`` (the default) asks for a bar where a person watches; a log file, a pipe or
cron gets none, whatever the option says (a bar redrawn with carriage returns fills a log with
frames). ``--no-progress`` turns it off on a terminal too.
"""
from __future__ import annotations


def hidden(progress: bool) -> bool | None:
    """tqdm's ``disable`` for a job's progress option: True (no bar) when it is off; else None,
    which tqdm reads as "only when the output is a terminal"."""
    return True if not progress else None
