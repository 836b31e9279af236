"""`ast.parse` for the tests that read the project's own source.

CPython 3.11 before 3.11.8 keeps the parser's recursion counter in global state, so a parse that
runs while another thread of the process compiles something (an annotation evaluated, a lazily
imported module) can fail with "SystemError: AST constructor recursion depth mismatch"
(CPython gh-106905) though the source is fine; the suite's workers run such threads. That one
error is parsed again; anything else, a syntax error included, is raised as it is.
"""
from __future__ import annotations

import ast

_RACE = "AST constructor recursion depth mismatch"
_TRIES = 3


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(_TRIES):
        try:
            return ast.parse(source, filename)
        except SystemError as exc:
            if _RACE not in str(exc) or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")
