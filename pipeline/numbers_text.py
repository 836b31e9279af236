"""How a metric value is written where people read it (a W&B table cell, a report's legend).

Python's shortest round-trip form, without a trailing ``.0``: ``1.0`` -> ``"1"``, ``0.5`` ->
``"0.5"``, ``0.1234561`` -> ``"0.1234561"``. Two different values never print alike, which
``f"{v:g}"`` (six significant digits) does not promise: 0.1234561 and 0.1234564 are both
``0.123456`` there, and a table or a legend merged them.
"""
from __future__ import annotations


def value_text(value: float) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text
