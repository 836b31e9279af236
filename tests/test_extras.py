"""Each extra of pyproject.toml installs what its documented examples need, on its own.

`pip install -e '.[ray]'` once left Ray Data without pandas, and `make test` hid it because the
verl extra brings pandas along. So each extra is checked alone, from installed metadata and
without a network: the modules its documentation's examples import are imported in a fresh
interpreter, every third-party distribution they load must be declared by the extra, by the base
dependencies or by their requirements (walked transitively, markers evaluated, extras followed),
and the features a library declares as an extra of its own (Ray Data is `ray[data]`) must be
declared whole.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.extras import missing

ROOT = Path(__file__).resolve().parents[1]
OURS = {"pipeline", "jobs", "schemas", "sql", "tests"}

# extra -> (the page whose examples it serves, the modules those examples import or use at run
# time, {distribution: its extras the examples use})
EXAMPLES: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "wandb": ("docs/wandb.md", ("wandb", "pipeline.adapters.wandb.tracker",
                                "pipeline.adapters.wandb.offline"), {}),
    # the buffer as a Ray actor, and the lake through Ray Data (`lake_dataset`, `export --ray`)
    "ray": ("docs/ray.md", ("ray", "ray.data", "pipeline.adapters.ray.client",
                            "jobs.export.ray"), {"ray": ("data",)}),
    # verl and transferqueue themselves go in with --no-deps (README, "Installing"): the extra
    # declares what they need at run time
    "verl": ("docs/verl.md", ("transfer_queue", "verl.trainer.ppo.v1.replay_buffer",
                              "pipeline.adapters.verl.dropin"), {}),
}
INSTALLED_APART = {"verl": {"verl", "transferqueue"}}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def declared(requirements: list[str]) -> dict[str, set[str]]:
    """Every distribution ``requirements`` bring in -> the extras asked of it ("" for the
    distribution itself): each one's requirements walked from installed metadata, markers
    evaluated for this interpreter and for the extras asked."""
    env = default_environment()

    def applies(req: Requirement, extras: set[str]) -> bool:
        return req.marker is None and "" in extras or req.marker is not None and any(
            req.marker.evaluate({**env, "extra": e}) for e in extras)

    seen: dict[str, set[str]] = {}
    todo = [r for r in map(Requirement, requirements) if applies(r, {""})]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        new = ({""} | {canonicalize_name(e) for e in req.extras}) - seen.get(name, set())
        if not new:
            continue
        seen.setdefault(name, set()).update(new)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue        # declared but not installed here: the import check below tells
        todo += [sub for sub in map(Requirement, requires) if applies(sub, new)]
    return seen


def test_the_walk_follows_a_requirements_extras_and_markers() -> None:
    with_data = declared(["ray==2.60.0; python_version >= '3'"])
    assert "pandas" not in declared(["ray"]) and "pandas" in declared(["ray[data]"])
    assert "click" in with_data and "pandas" not in with_data   # markers, no extra asked


_PROBE = """
import sys
before = set(sys.modules)      # what starts with the interpreter (a .pth file's hook) is not counted
import importlib, json, os, sysconfig, warnings
blocked = set(json.loads(sys.argv[1]))


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)  # as if absent


sys.meta_path.insert(0, Block())
warnings.simplefilter("ignore")
for m in json.loads(sys.argv[2]):
    importlib.import_module(m)
site = os.path.realpath(sysconfig.get_paths()["purelib"])
out = {}
for name, mod in list(sys.modules.items()):
    top = name.split(".")[0]
    where = getattr(mod, "__file__", None)
    if name in before or top in sys.stdlib_module_names or not where:
        continue
    rel = os.path.relpath(os.path.realpath(where), site)
    if not rel.startswith(".."):
        first = rel.split(os.sep)[0]     # a copy a wheel ships inside itself counts as its
        out.setdefault(top, first if os.sep in rel else first.split(".")[0])
print(json.dumps(out))
"""


def _probe(modules: tuple[str, ...], blocked: tuple[str, ...] = ()) -> dict[str, str] | None:
    """Top-level module -> the folder of site-packages it was loaded from, for every third-party
    module a fresh interpreter holds after importing ``modules``; None when the imports fail with
    ``blocked`` made unimportable."""
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(blocked), json.dumps(modules)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    if res.returncode != 0 and blocked:
        return None
    if res.returncode != 0 and "ModuleNotFoundError" in res.stderr:
        missing(f"not installed here: {res.stderr.strip().splitlines()[-1]}")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_probe_tells_a_needed_module_from_an_optional_one() -> None:
    assert _probe(("pipeline.analysis.views",), blocked=("duckdb",)) is None
    assert _probe(("pipeline.analysis.views",), blocked=("no_such_module",)) is not None


@pytest.mark.parametrize("extra", sorted(EXAMPLES))
def test_each_extra_declares_what_its_documented_examples_import(extra: str) -> None:
    project = _project()
    page, modules, features = EXAMPLES[extra]
    assert (ROOT / page).exists(), page
    assert extra in project["optional-dependencies"], extra
    have = declared([*project["dependencies"], *project["optional-dependencies"][extra]])
    have_names = set(have) | {canonicalize_name(d) for d in INSTALLED_APART.get(extra, ())}
    providers = metadata.packages_distributions()
    loaded = _probe(modules)
    missing = {m: providers.get(folder, [folder]) for m, folder in loaded.items()
               if m not in OURS and folder not in OURS
               and not {canonicalize_name(d) for d in providers.get(folder, [folder])} & have_names}
    # a module imported only when it happens to be installed (pyarrow's `cloudpickle`) is not
    # needed: the examples still import without it
    needed = {m: ds for m, ds in missing.items() if _probe(modules, blocked=(m,)) is None}
    assert not needed, (f"the {extra!r} extra does not declare what {page}'s examples import "
                        f"(module: distributions): {needed}")
    for dist, wanted in features.items():
        lacking = [e for e in wanted if canonicalize_name(e) not in have.get(dist, set())]
        needs = [r for r in metadata.requires(dist) or []
                 if any(f'extra == "{e}"' in r for e in lacking)]
        undeclared = sorted({canonicalize_name(Requirement(r).name) for r in needs}
                            - set(have))
        assert not undeclared, (f"{page}'s examples use {dist}[{', '.join(wanted)}], which needs "
                                f"{undeclared}; the {extra!r} extra does not declare them")
