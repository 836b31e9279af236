"""The package's shape, read from its source with `ast`: no import cycle among the modules, no
module reaching another module's private names, and jobs that use the families only through
their faces.

Each check walks the source, not the running program, so it sees every module whether a test
imports it or not. Violations that other work still has to remove are listed in `KNOWN_*` sets
(to be removed by the lead): the tests pass with them and fail on any new one, and on a listed
one that is gone (so the lists only shrink)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import python_ast

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "sql", "schemas")     # the project's importable code besides jobs/


# --- reading the source ---------------------------------------------------------------------------
def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> its file, for every .py under the packages (a package is its
    `__init__`)."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_time_statements(body: list[ast.stmt]):
    """The statements that run when the module is imported: everything but function bodies and
    the `if TYPE_CHECKING:` branch (its `else` does run)."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from import_time_statements(node.orelse)
            continue
        for name in ("body", "orelse", "finalbody", "handlers"):
            children = getattr(node, name, None)
            if isinstance(children, list):
                yield from import_time_statements(
                    [c for c in children if isinstance(c, (ast.stmt, ast.excepthandler))])


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, with a relative one made absolute."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@dataclass(frozen=True)
class Face:
    """A family's face: public name -> (home module, attribute), and the submodules it offers."""
    homes: dict[str, tuple[str, str]]
    modules: frozenset[str] = field(default_factory=frozenset)


def _value(node: ast.expr) -> object:
    """A literal, or one spelled with `dict.fromkeys` / `**` as the top-level face spells it."""
    return eval(compile(ast.Expression(node), "<face>", "eval"), {"__builtins__": {}, "dict": dict})


def faces(files: dict[str, Path]) -> dict[str, Face]:
    """Every package whose `__init__` maps public names to home modules: a family calling
    `face(__name__, {...}, modules=(...))`, and the top-level package's `_HOMES`."""
    out: dict[str, Face] = {}
    for name, path in files.items():
        if path.name != "__init__.py":
            continue
        tree = python_ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "face":
                homes = _value(node.args[1])
                mods = next((_value(k.value) for k in node.keywords if k.arg == "modules"), ())
                out[name] = Face({n: (f"{name}.{h.partition(':')[0]}", h.partition(":")[2] or n)
                                  for n, h in homes.items()}, frozenset(mods))
            elif (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
                  and any(getattr(t, "id", None) == "_HOMES"
                          for t in (node.targets if isinstance(node, ast.Assign)
                                    else [node.target]))):
                out[name] = Face({n: (f"{name}.{h}", n) for n, h in _value(node.value).items()})
    return out


def _with_parents(module: str, known: dict[str, Path], importer: str) -> list[str]:
    """Importing `a.b.c` runs `a`, `a.b` and `a.b.c`: those of them that are ours, less the
    importer's own packages (they are being imported already: Python does not run them again,
    so a submodule naming its package closes no cycle)."""
    parts = module.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            if m in known and not (importer + ".").startswith(m + ".")]


def import_edges(module: str, source: str, files: dict[str, Path],
                 face_map: dict[str, Face], is_package: bool = False) -> set[str]:
    """The modules of ours that importing `module` runs, from its import-time statements. A name
    taken from a face is an edge to the module that defines it (the face imports it then)."""
    edges: set[str] = set()
    for node in import_time_statements(python_ast.parse(source).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.update(_with_parents(alias.name, files, module))
        elif isinstance(node, ast.ImportFrom):
            source_module = _absolute(module, is_package, node)
            edges.update(_with_parents(source_module, files, module))
            face = face_map.get(source_module)
            for alias in node.names:
                sub = f"{source_module}.{alias.name}"
                if sub in files:
                    edges.add(sub)
                elif face is not None and alias.name in face.homes:
                    edges.update(_with_parents(face.homes[alias.name][0], files, module))
    edges.discard(module)
    return edges


def import_graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    files = module_files() if files is None else files
    face_map = faces(files)
    return {m: import_edges(m, p.read_text(), files, face_map, p.name == "__init__.py")
            for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}            # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


# --- private names --------------------------------------------------------------------------------
# Underscored attributes that are public API, or that we use on purpose; each with its reason.
ALLOWED_ATTRIBUTES: dict[str, str] = {
    "_replace": "namedtuple's public API (underscored so it cannot clash with a field)",
    "_asdict": "namedtuple's public API",
    "_fields": "namedtuple's public API",
    "_make": "namedtuple's public API",
}
ALLOWED_REACHES: dict[tuple[str, str], str] = {
    ("os", "_exit"): "documented: end a process at once, without cleanup (the soak's and crash "
                     "tests' killed workers)",
    ("sys", "_getframe"): "documented CPython API for a caller's frame",
}
# Not checked at all: names of modules outside the project (`import _signal`, the C half of
# `signal`, whose `getsignal` skips the enum conversion): they are the standard library's, and
# what we take of them is public there.


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(node: ast.expr) -> str:
    """`os` for `os._exit`, `self` for `self._x`, `` for an expression with no name."""
    while isinstance(node, ast.Attribute):
        node = node.value
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "super":
        return "super"
    return node.id if isinstance(node, ast.Name) else ""


def _own_names(tree: ast.Module) -> set[str]:
    """Names the module itself defines, at any depth: functions, classes, assignments and
    attributes it sets (`self._x = ...`). Its code may use its own privates on any object (a
    classmethod on the instance it builds, a module function on instances of its class)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
    return out


def private_reaches(module: str, source: str, files: dict[str, Path],
                    is_package: bool = False) -> set[str]:
    """What `module` reaches of other modules' privates: `from x import _y` of a name (a private
    submodule of the importer's own package is its package's, not a module's), and `obj._attr`
    where obj is not self, cls or super() and `_attr` is not the module's own. Each as
    "line: what"."""
    out: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    tree = python_ast.parse(source)
    own = _own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = _absolute(module, is_package, node)
            if not any(src == p or src.startswith(p + ".") for p in PACKAGES):
                continue
            for alias in node.names:
                if not _private(alias.name):
                    continue
                sub = f"{src}.{alias.name}"
                own_package_private = (sub in files or _compiled(sub)) and (
                    package == src or package.startswith(src + "."))
                if not own_package_private:
                    out.add(f"{node.lineno}: from {src} import {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _owner(node.value)
            if owner in ("self", "cls", "super") or node.attr in own \
                    or node.attr in ALLOWED_ATTRIBUTES:
                continue
            if (owner, node.attr) in ALLOWED_REACHES:
                continue
            out.add(f"{node.lineno}: {ast.unparse(node)}")
    return out


def _compiled(module: str) -> bool:
    """A compiled extension beside the sources (built from its .c file)."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".c").exists() or any(path.parent.glob(path.name + ".*.so"))


def all_private_reaches() -> set[str]:
    """Over the packages and jobs/."""
    files = module_files()
    checked = {**files, **module_files(packages=("jobs",))}
    return {f"{p.relative_to(ROOT)}:{hit}"
            for m, p in checked.items()
            for hit in private_reaches(m, p.read_text(), files, p.name == "__init__.py")}


# --- jobs and faces -------------------------------------------------------------------------------
def job_reaches(source: str, files: dict[str, Path], face_map: dict[str, Face]) -> set[str]:
    """Imports (anywhere in the file) of a family's insides: a module inside a face's package
    that the face does not offer in `modules=`, or a private module. Each as "line: module"."""
    out: set[str] = set()
    for node in ast.walk(python_ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            targets = [(node.lineno, node.module)]
            targets += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                        if f"{node.module}.{a.name}" in files]
        else:
            continue
        for line, target in targets:
            if target in files and not _offered(target, face_map):
                out.add(f"{line}: {target}")
    return out


def _offered(module: str, face_map: dict[str, Face]) -> bool:
    """May a job import `module`? A package (a face, or a folder of faces), a submodule its
    face offers whole, or a plain module of the top-level package outside every family."""
    parent, _, leaf = module.rpartition(".")
    if _private(leaf):
        return False
    if module in face_map or not module.startswith("pipeline."):
        return True
    if (ROOT.joinpath(*module.split(".")) / "__init__.py").exists():
        return True
    if parent in face_map and leaf in face_map[parent].modules:
        return True
    return parent == "pipeline"


def all_job_reaches() -> set[str]:
    files = module_files()
    face_map = faces(files)
    return {f"{path.relative_to(ROOT)}:{hit}"
            for path in sorted((ROOT / "jobs").rglob("*.py")) if "__pycache__" not in path.parts
            for hit in job_reaches(path.read_text(), files, face_map)}


# --- what other work still has to remove (to be removed by the lead) ------------------------------
# Keyed without line numbers ("file: what"), so that edits elsewhere in a file do not move them.
KNOWN_PRIVATE_REACHES: set[str] = set()
KNOWN_JOB_REACHES: set[str] = set()


def _key(hit: str) -> str:
    """ "path:12: what" -> "path: what" """
    return re.sub(r":\d+: ", ": ", hit, count=1)


def _check(found: set[str], known: set[str]) -> None:
    keys = {_key(v): v for v in found}
    new = sorted(v for k, v in keys.items() if k not in known)
    gone = sorted(known - keys.keys())
    assert not new and not gone, "\n".join(
        [f"new: {v}" for v in new] + [f"gone (drop it from the KNOWN set): {v}" for v in gone])


# --- the checks -----------------------------------------------------------------------------------
def test_no_import_cycle_among_the_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_reaches_another_modules_private_names():
    _check(all_private_reaches(), KNOWN_PRIVATE_REACHES)


def test_jobs_import_the_families_only_through_their_faces():
    _check(all_job_reaches(), KNOWN_JOB_REACHES)


# --- the checkers themselves, on tiny literal sources ---------------------------------------------
_FILES = {m: Path(m.replace(".", "/") + ".py") for m in (
    "pipeline", "pipeline.lake", "pipeline.lake.files", "pipeline.lake.writer",
    "pipeline.lake.kill",
    "pipeline.state", "pipeline.state.journal", "pipeline.errors", "pipeline._face")}
_FACES = {"pipeline.lake": Face({"LakeWriter": ("pipeline.lake.writer", "LakeWriter"),
                                 "batches": ("pipeline.lake.verify", "verified")},
                                frozenset({"kill"}))}


def _edges(source: str, module: str = "pipeline.state.journal") -> set[str]:
    return import_edges(module, source, _FILES, _FACES)


def test_a_name_from_a_face_is_an_edge_to_its_home_module():
    assert _edges("from pipeline.lake import LakeWriter\n") == {
        "pipeline.lake", "pipeline.lake.writer"}


def test_a_submodule_naming_its_own_package_is_no_edge_to_it():
    assert _edges("from pipeline.lake import LakeWriter\n", "pipeline.lake.files") == {
        "pipeline.lake.writer"}


def test_an_import_inside_a_function_or_under_type_checking_is_not_an_edge():
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from pipeline.lake import LakeWriter\n"
              "else:\n    import pipeline.errors\n"
              "def f():\n    from pipeline.lake.files import x\n")
    assert _edges(source) == {"pipeline.errors"}


def test_a_relative_import_resolves_against_the_modules_package():
    assert "pipeline.lake.files" in _edges("from .files import x\n", "pipeline.lake.writer")
    assert "pipeline.errors" in _edges("from ..errors import E\n", "pipeline.lake.writer")


def test_a_cycle_is_named_whole_and_a_tree_has_none():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_a_private_name_of_another_module_is_a_reach():
    source = ("from pipeline.lake.files import _crc\n"
              "import os\n"
              "def f(writer, t):\n"
              "    os._exit(1)\n"
              "    t._replace(a=1)\n"
              "    return writer._lock, self._mine, super()._also_mine\n")
    assert private_reaches("pipeline.state.journal", source, _FILES) == {
        "1: from pipeline.lake.files import _crc", "6: writer._lock"}


def test_a_modules_own_private_on_another_object_is_no_reach():
    source = ("class Lock:\n    def _forget(self):\n        pass\n"
              "def close_all(locks):\n    for lock in locks:\n        lock._forget()\n"
              "def peek(other):\n    return other._elsewhere\n")
    assert private_reaches("pipeline.lake.lock", source, _FILES) == {"8: other._elsewhere"}


def test_a_private_submodule_is_its_own_packages_to_import():
    assert private_reaches("pipeline.lake.writer", "from pipeline import _face\n", _FILES) == set()
    assert private_reaches("pipeline.lake.writer", "from pipeline.lake.files import _f\n",
                           _FILES) == {"1: from pipeline.lake.files import _f"}


def test_a_job_may_import_faces_and_the_modules_they_offer_but_not_a_familys_insides():
    source = ("import pipeline\nfrom pipeline.lake import LakeWriter, kill\n"
              "from pipeline.errors import ConfigError\nimport pipeline.lake.kill\n"
              "def main():\n    from pipeline.lake.files import segment_files\n"
              "    from pipeline import _face\n")
    assert job_reaches(source, _FILES, _FACES) == {"6: pipeline.lake.files", "7: pipeline._face"}
