"""A subpackage's face: its public names, each imported from its home module on first use.

Every family of modules (`pipeline.lake`, `pipeline.decide`, ...) exports the names other code may
use through its `__init__`, and imports the module that defines one only when it is first asked
for (PEP 562). Importing one module of a family (`pipeline.lake.files`) then never runs the rest
of it, so the families can use each other without import cycles, and the command line starts
without polars or torch where it needs neither."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def face(package: str, homes: dict[str, str], modules: tuple[str, ...] = ()
         ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`__getattr__`, `__dir__` and `__all__` for `package`.

    Public name N is `package.<homes[N]>.N`, or `package.<module>.<attr>` where `homes[N]` is
    `"module:attr"` (a name the face gives to something its module calls otherwise). `modules`
    are submodules the face offers whole, for callers that use a family of its names (the kill
    points of crash testing, say)."""
    namespace = importlib.import_module(package).__dict__
    clash = sorted(set(homes) & {h.partition(":")[0] for h in homes.values()})
    if clash:           # `import package.<m>` would set the attribute to the module, silently
        raise ImportError(f"{package}: public names {clash} are also its modules' names")

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            if name in modules:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = home.partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attr or name)
        namespace[name] = value          # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes) | set(modules))

    return __getattr__, __dir__, sorted([*homes, *modules])
