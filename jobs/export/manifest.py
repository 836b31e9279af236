"""An export's manifest: written after every shard, read back by a re-run to tell which shards are
complete, and checked, never trusted blindly.

Why check the files: a re-run skips a shard only when every file of it still has the size *and*
the sha256 the manifest recorded, so a shard damaged in place (a flipped byte, a file rewritten by
hand, a copy cut short) is written again instead of being reported complete. Why check the
manifest: it is the one file a re-run believes, so one that does not parse, or whose entries are
not what `export` writes (another shape, a file path outside its shard's place), is refused
naming the file; a re-run never deletes or skips anything on the word of such a manifest.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pipeline.errors import ReplayLakeError
from pipeline.lake import replace_durably

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "replaylake-export/1"
_BLOCK = 1 << 20


class ExportError(ReplayLakeError, ValueError):
    """The export cannot run as asked (unknown partition or step, bad option, foreign --out,
    an unreadable manifest, trained rows whose payload retention dropped)."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def atomic(path: Path, write: Any) -> dict[str, Any]:
    """Write via ``write(tmp_path)``, then put it in place durably (its bytes fsynced, renamed,
    the directory fsynced, and so every directory the export created: a power loss after the
    manifest names a shard leaves the shard there); returns the file's size and sha256."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    replace_durably(tmp, path)
    return {"bytes": path.stat().st_size, "sha256": sha256(path)}


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    atomic(out / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))


def shard_path(partition: str, index: int, fmt: str) -> str:
    """Where a shard's file lies, relative to the export directory."""
    return f"{partition}/shard-{index:05d}.{fmt}"


def _entry_problem(s: Any) -> str | None:
    if not isinstance(s, dict):
        return "a shard entry is not an object"
    p, i, files = s.get("partition"), s.get("index"), s.get("files")
    if not isinstance(p, str) or not isinstance(i, int) or isinstance(i, bool) or i < 0:
        return f"shard entry {json.dumps(s)[:60]} has no partition and index"
    if not isinstance(s.get("rows_key"), str) or not isinstance(files, dict):
        return f"shard {p}/{i} has no rows_key or files"
    for fmt, f in files.items():
        if not isinstance(f, dict) or f.get("path") != shard_path(p, i, fmt):
            return f"shard {p}/{i}: its {fmt} file is not at {shard_path(p, i, fmt)}"
        if not isinstance(f.get("bytes"), int) or not isinstance(f.get("sha256"), str):
            return f"shard {p}/{i}: its {fmt} file has no size or sha256"
    return None


def check_out(out: Path) -> None:
    """Refuse an output directory that is a lake, or that holds files but no export: the export
    would write its shards among them and delete what looks like its own temporary files. A
    directory holding only shard files (an export killed before its first manifest) is taken."""
    from pipeline.lake import is_lake
    if is_lake(out):
        raise ExportError(f"--out {out} is a replaylake lake; write the export somewhere else, "
                          f"e.g. {out.parent / 'export'}")
    if not out.is_dir() or (out / MANIFEST).exists():
        return
    for entry in out.iterdir():
        if not entry.is_dir() or any(not f.name.lstrip(".").startswith("shard-")
                                     for f in entry.iterdir()):
            raise ExportError(f"--out {out} holds files but no export ({MANIFEST}), e.g. "
                              f"{entry}; name a new or empty directory")


def read_done(out: Path, selection: dict[str, Any], lake: str
              ) -> dict[tuple[str, int], dict[str, Any]]:
    """The shards a previous run of the same export recorded, by (partition, index); empty when
    ``out`` holds no manifest. Refuses a manifest that cannot be read, one of another export (of
    another lake, ``lake`` being this one's resolved path, or with other options), and one whose
    entries are not what `export` writes. Another lake's shards are never taken as done: two
    lakes of like runs hold like sequence numbers, so a shard's rows key could match."""
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ExportError(f"the export manifest {path} cannot be read ({exc}); remove it to "
                          "write every shard again, or use another --out") from exc
    if not isinstance(old, dict) or not isinstance(old.get("shards"), list):
        raise ExportError(f"{path} is not an export manifest (no shard list); remove it to "
                          "write every shard again, or use another --out")
    if old.get("lake") != lake:
        raise ExportError(f"{out} holds an export of another lake ({old.get('lake')}); use "
                          f"another --out for {lake}, or --lake {old.get('lake')} to resume that "
                          "export")
    if old.get("format") != MANIFEST_FORMAT or old.get("selection") != selection:
        was = old.get("selection") if isinstance(old.get("selection"), dict) else {}
        differ = [f"{_option(k)} {_option_value(k, was.get(k))} there, "
                  f"{_option_value(k, selection.get(k))} now"
                  for k in sorted(set(was) | set(selection)) if was.get(k) != selection.get(k)]
        raise ExportError(f"{out} holds an export made with other options ("
                          f"{'; '.join(differ) or 'another manifest format'}); use another "
                          "--out, or the same options to resume it")
    for s in old["shards"]:
        problem = _entry_problem(s)
        if problem:
            raise ExportError(f"{path} is damaged: {problem}; remove it to write every shard "
                              "again, or use another --out")
    return {(s["partition"], s["index"]): s for s in old["shards"]}


# a selection key -> the option that sets it, where the two are not spelled alike
_OPTIONS = {"partitions": "--partition", "formats": "--format"}


def _option(key: str) -> str:
    """The command-line option of a manifest's selection key (`rows_per_shard` ->
    `--rows-per-shard`)."""
    return _OPTIONS.get(key, "--" + key.replace("_", "-"))


def _option_value(key: str, value: Any) -> str:
    """A selection value as its option is written: steps `5:20`, `5:`, `:20`, `5` or `all`;
    partitions and formats listed (`all`: every partition); nothing recorded: `unset`."""
    if value is None:
        return "unset"
    if key == "steps" and isinstance(value, list) and len(value) == 2:
        lo, hi = value
        if lo is None and hi is None:
            return "all"
        if lo == hi:
            return str(lo)
        return f"{'' if lo is None else lo}:{'' if hi is None else hi}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "all"
    return str(value)


def intact(out: Path, entry: dict[str, Any] | None, key: str, formats: tuple[str, ...]) -> str:
    """What a re-run does with a shard: ``"done"`` (the manifest has it with these rows, and every
    file has its recorded size and sha256), ``"damaged"`` (same rows, but a file is missing or
    differs) or ``"new"`` (not recorded, or recorded with other rows)."""
    if entry is None or entry["rows_key"] != key or set(entry["files"]) != set(formats):
        return "new"
    for f in entry["files"].values():
        path = out / f["path"]
        if not path.is_file() or path.stat().st_size != f["bytes"] or sha256(path) != f["sha256"]:
            return "damaged"
    return "done"


__all__ = ["ExportError", "MANIFEST", "MANIFEST_FORMAT", "atomic", "check_out", "intact",
           "read_done", "sha256", "shard_path", "write_manifest"]
