"""A disk that loses power, replayed from a program's system calls (see `syscall_trace`).

The model, the one crash-consistency checkers such as ALICE and CrashMonkey assume of a POSIX file
system on a disk that honours fsync:

- a file holds, after power loss, its content as of its last fsync (or fdatasync), plus any
  prefix, in order, of the writes (and truncations) made to it since, the last of them possibly
  cut in the middle;
- a directory's entries (a create, mkdir, rename or unlink in it) are durable only once the
  directory itself was fsync'ed; before that, any prefix in order of its changes may have
  reached the disk, so a new file's name may be absent however often the file was fsync'ed;
- a rename is atomic: the name points to the old file or to the new one;
- what was on the disk before the program started is durable.

`Disk` holds, for every file and directory, what the program sees, what is durable and the
changes since (``pending``); `disk_calls.Replay` applies a program's system calls to it, one at a
time. `crash_images` lists, at a moment, the distinct disk contents a power loss then could
leave: nothing pending (everything as of the last fsyncs), everything pending (what a process
kill leaves: the page cache), global prefixes of the pending changes cut at a few points (each
also with the change at the cut torn halfway), every pending file write without any pending
directory change and the reverse, and each recently changed file or directory alone with its
changes. Every image is a mapping of paths (relative to the root) to bytes, None for a
directory.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

Image = dict[str, "bytes | None"]


@dataclass(eq=False)
class Node:
    """A file or a directory: what the program sees now and what is durable."""

    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    entries: dict[str, Node] = field(default_factory=dict)
    durable_entries: dict[str, Node] = field(default_factory=dict)
    pending: list[tuple[int, tuple]] = field(default_factory=list)   # (seq, change) since fsync

    def sync(self) -> None:
        if self.is_dir:
            self.durable_entries = dict(self.entries)
        else:
            self.durable = bytes(self.data)
        self.pending.clear()


def _change_file(data: bytearray, change: tuple, torn: bool = False) -> None:
    if change[0] == "write":
        off, raw = change[1], change[2]
        raw = raw[: len(raw) // 2] if torn else raw
        if off > len(data):
            data.extend(bytes(off - len(data)))
        data[off:off + len(raw)] = raw
    elif not torn:                                  # truncate: all or nothing
        size = change[1]
        del data[size:]
        data.extend(bytes(size - len(data)))


def _change_dir(entries: dict[str, Node], change: tuple) -> None:
    if change[0] == "link":
        entries[change[1]] = change[2]
    elif change[0] == "unlink":
        entries.pop(change[1], None)
    elif change[1] in entries:                      # rename: atomic
        entries[change[2]] = entries.pop(change[1])


class Disk:
    """The simulated disk under ``root``, which held ``before`` (all of it durable) when the
    program started (take it with `on_disk` before the run)."""

    def __init__(self, root: str | os.PathLike, before: Image):
        self.root = os.path.realpath(root)
        self.top = Node(True)
        for path, data in sorted(before.items()):     # parents sort before their entries
            parent, name = self.top, path
            if "/" in path:
                head, name = path.rsplit("/", 1)
                parent = self.lookup(os.path.join(self.root, head))
            parent.entries[name] = Node(True) if data is None else Node(False, bytearray(data))
        self._settle(self.top)
        self.seq = 0
        self.dirty: dict[int, Node] = {}       # id -> node with pending changes (in order)

    def _settle(self, node: Node) -> None:
        node.sync()
        for child in node.entries.values():
            self._settle(child)

    def under(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + "/")

    def lookup(self, path: str) -> Node | None:
        """The node at an absolute path under the root, as the program sees it now."""
        node = self.top
        rel = os.path.relpath(path, self.root)
        for part in [] if rel == "." else rel.split("/"):
            node = node.entries.get(part) if node is not None and node.is_dir else None
        return node

    def pend(self, node: Node, change: tuple) -> None:
        """A change the program made: visible at once, durable only once ``node`` is synced."""
        self.seq += 1
        node.pending.append((self.seq, change))
        if node.is_dir:
            _change_dir(node.entries, change)
        else:
            _change_file(node.data, change)
        self.dirty.pop(id(node), None)
        self.dirty[id(node)] = node

    def sync(self, node: Node | None = None) -> None:
        """fsync ``node`` (None: everything, as sync(2) does)."""
        for n in [node] if node is not None else list(self.dirty.values()):
            n.sync()
            self.dirty.pop(id(n), None)

    # -- what a power loss leaves -------------------------------------------------------------

    def image(self, chosen: dict[int, bool] | None = None) -> Image:
        """The disk with the pending changes in ``chosen`` applied (seq -> False: torn halfway);
        None: all of them, as the program sees the files now."""
        out: Image = {}

        def walk(node: Node, rel: str) -> None:
            entries = dict(node.entries if chosen is None else node.durable_entries)
            for seq, change in node.pending if chosen is not None else ():
                if seq in chosen:
                    _change_dir(entries, change)
            for name, child in sorted(entries.items()):
                path = f"{rel}/{name}" if rel else name
                if child.is_dir:
                    out[path] = None
                    walk(child, path)
                elif chosen is None:
                    out[path] = bytes(child.data)
                else:
                    data = bytearray(child.durable)
                    for seq, change in child.pending:
                        if seq in chosen:
                            _change_file(data, change, torn=not chosen[seq])
                    out[path] = bytes(data)

        walk(self.top, "")
        return out

    def crash_images(self) -> Iterator[tuple[str, Image]]:
        """(how, image) for each distinct disk a power loss now could leave (module doc)."""
        changes = sorted((seq, node.is_dir, change) for node in self.dirty.values()
                         for seq, change in node.pending)
        seqs = [s for s, _, _ in changes]
        n = len(seqs)
        ways: list[tuple[str, dict[int, bool]]] = [("synced", {}), ("page cache", dict.fromkeys(
            seqs, True))]
        for k in sorted({1, n // 2, n - 1} - {0, n}):
            ways.append((f"first {k}/{n} changes", dict.fromkeys(seqs[:k], True)))
        for k in sorted({n // 2, n - 1} & set(range(n))):
            if changes[k][2][0] == "write" and len(changes[k][2][2]) > 1:
                ways.append((f"first {k}/{n} changes, the next one torn",
                             {**dict.fromkeys(seqs[:k], True), seqs[k]: False}))
        ways.append(("file writes, no directory change",
                     {s: True for s, is_dir, _ in changes if not is_dir}))
        ways.append(("directory changes, no file write",
                     {s: True for s, is_dir, _ in changes if is_dir}))
        for node in list(self.dirty.values())[-3:]:
            ways.append((f"only one {'directory' if node.is_dir else 'file'}'s changes",
                         dict.fromkeys((s for s, _ in node.pending), True)))
        seen = set()
        for how, chosen in ways:
            img = self.image(chosen)
            key = digest(img)
            if key not in seen:
                seen.add(key)
                yield how, img


def digest(image: Image) -> str:
    h = hashlib.sha256()
    for path, data in sorted(image.items()):
        h.update(path.encode() + b"\0" + (b"D" if data is None else b"F" + data) + b"\0")
    return h.hexdigest()


def on_disk(root: Path) -> Image:
    """What is under ``root`` now, in the same form (to check the model against the run)."""
    out: Image = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirs:
            out[os.path.normpath(os.path.join(rel, d))] = None
        for f in files:
            out[os.path.normpath(os.path.join(rel, f))] = Path(dirpath, f).read_bytes()
    return out


def materialize(image: Image, target: Path) -> Path:
    """Write ``image`` out under ``target`` (which must not exist yet)."""
    target.mkdir(parents=True)
    for path, data in sorted(image.items()):
        if data is None:
            (target / path).mkdir()
        else:
            (target / path).write_bytes(data)
    return target
