"""Keyword checks for the preset constructors, so a typo names the method the user called."""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

from pipeline.errors import PresetKeywordError


def did_you_mean(name: Any, known: list[str]) -> str:
    """"; did you mean 'x'?" for the closest of ``known`` to a misspelt ``name``, else ""."""
    close = difflib.get_close_matches(str(name), known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def preset_kwargs(where: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` unchanged when ``fn`` accepts each of them; else an error naming ``where``."""
    known = [p for p in inspect.signature(fn).parameters]
    for k in kwargs:
        if k not in known:
            raise PresetKeywordError(
                f"{where}() got an unexpected keyword argument {k!r}{did_you_mean(k, known)} (keywords: "
                f"lake, fsync, allow_changes, max_live_bytes, {', '.join(known)})")
    return kwargs
