"""Keyword checks for the preset constructors, so a typo names the method the user called."""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

from pipeline.errors import PresetKeywordError


def preset_kwargs(where: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` unchanged when ``fn`` accepts each of them; else an error naming ``where``."""
    known = [p for p in inspect.signature(fn).parameters]
    for k in kwargs:
        if k not in known:
            close = difflib.get_close_matches(k, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PresetKeywordError(
                f"{where}() got an unexpected keyword argument {k!r}{hint} (keywords: "
                f"lake, fsync, allow_changes, max_live_bytes, {', '.join(known)})")
    return kwargs
