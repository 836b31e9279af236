"""The demo's command-line flags, derived from `DemoConfig` (each flag's field holds its default
and its help), so adding or changing a knob of the demo is one edit, in the configuration."""
from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Annotated, Any

import typer

from jobs.demo.config import DemoConfig
from pipeline.errors import ConfigError

# what a flag of a field that may be None takes for None
NONE_WORDS = ("none", "off", "")


def parameters() -> list[inspect.Parameter]:
    """One keyword parameter per flag field, in field order, as typer reads a signature.

    A field that may be None (``threshold: int | None``) becomes a text flag: the command line
    has no None, so 'none' (or 'off') stands for it and `config` parses the rest."""
    out = []
    for f, kind in _flag_fields():
        inner = _optional(kind)
        if inner is None:
            annotation, default = kind, f.default
        else:
            annotation, default = str, "none" if f.default is None else str(f.default)
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                     annotation=Annotated[annotation,
                                                          typer.Option(help=f.metadata["flag"])]))
    return out


def config(values: Mapping[str, Any]) -> DemoConfig:
    """The configuration the flags' ``values`` ask for (every other field at its default)."""
    kinds = dict((f.name, kind) for f, kind in _flag_fields())
    given = {}
    for name, value in values.items():
        inner = _optional(kinds[name])
        given[name] = _parse(name, value, inner) if inner is not None else value
    return DemoConfig(**given)


def _flag_fields() -> list[tuple[Any, Any]]:
    hints = typing.get_type_hints(DemoConfig)
    return [(f, hints[f.name]) for f in fields(DemoConfig) if "flag" in f.metadata]


def _optional(kind: Any) -> Any:
    """``T`` for ``T | None``, else None."""
    args = typing.get_args(kind)
    if type(None) not in args:
        return None
    (inner,) = [a for a in args if a is not type(None)]
    return inner


def _parse(name: str, text: str, kind: type) -> Any:
    if text.strip().lower() in NONE_WORDS:
        return None
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else f"a {kind.__name__}"
        raise ConfigError(f"--{name.replace('_', '-')} {text!r}: give {what} or 'none'") from None
