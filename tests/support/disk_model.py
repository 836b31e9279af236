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

`Disk` follows the calls one at a time, keeping for every file and directory what is durable and
the changes since (``pending``). `crash_images` lists, at a moment, the distinct disk contents a
power loss then could leave: nothing pending (everything as of the last fsyncs), everything
pending (what a process kill leaves: the page cache), global prefixes of the pending changes cut
at a few points (each also with the change at the cut torn halfway), every pending file write
without any pending directory change and the reverse, and each recently changed file or directory
alone with its changes. Every image is a mapping of paths (relative to the root) to bytes, None
for a directory.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.syscall_trace import Call, Fd, iovec_bytes

ACK = b"replaylake-ack "      # a traced program marks each acknowledged call by writing this
MARKER_FILE = "/dev/null"     # ... followed by the call's name, to this file
SYNCS = ("fsync", "fdatasync")
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


@dataclass
class _Open:
    node: Node
    pos: int = 0
    append: bool = False


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

    def __init__(self, root: Path, cwd: Path, before: Image):
        self.root = os.path.realpath(root)
        self.cwd = str(cwd)
        self.top = Node(True)
        for path, data in sorted(before.items()):     # parents sort before their entries
            parent, name = self.top, path
            if "/" in path:
                head, name = path.rsplit("/", 1)
                parent = self._lookup(os.path.join(self.root, head))
            parent.entries[name] = Node(True) if data is None else Node(False, bytearray(data))
        self._settle(self.top)
        self.fds: dict[int, _Open] = {}
        self.seq = 0
        self.dirty: dict[int, Node] = {}       # id -> node with pending changes (in order)
        self.acks: list[str] = []              # the calls acknowledged so far, by name
        self.children: set[int] = set()        # processes the program forked (followed: no)

    def _settle(self, node: Node) -> None:
        node.sync()
        for child in node.entries.values():
            self._settle(child)

    # -- following the calls ------------------------------------------------------------------

    def apply(self, call: Call) -> None:
        """Follow one system call (failed calls change nothing)."""
        ret = call.ret
        if isinstance(ret, int) and ret < 0:
            return
        if call.tid in self.children:           # a forked helper (an ldconfig, say)
            if self._touches(call):
                raise NotImplementedError(f"strace line {call.line}: a forked process "
                                          f"({call.tid}) changed the lake; the model follows one")
            return
        handler = getattr(self, "_" + call.name, None)
        if handler is None:
            raise NotImplementedError(f"strace line {call.line}: no model for {call.name}")
        handler(call, *call.args)

    def _under(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + "/")

    def _path(self, base: Fd | None, raw: bytes) -> str:
        name = os.fsdecode(raw)
        start = self.cwd if base is None or base.num is None and not base.path else base.path
        return os.path.normpath(os.path.join(start, name))

    def _lookup(self, path: str) -> Node | None:
        node = self.top
        rel = os.path.relpath(path, self.root)
        for part in [] if rel == "." else rel.split("/"):
            node = node.entries.get(part) if node is not None and node.is_dir else None
        return node

    def _parent(self, path: str, line: int) -> tuple[Node, str]:
        parent = self._lookup(os.path.dirname(path))
        if parent is None or not parent.is_dir:
            raise AssertionError(f"strace line {line}: {path}'s directory is not in the model")
        return parent, os.path.basename(path)

    def _pend(self, node: Node, change: tuple) -> None:
        self.seq += 1
        node.pending.append((self.seq, change))
        if node.is_dir:
            _change_dir(node.entries, change)
        else:
            _change_file(node.data, change)
        self.dirty.pop(id(node), None)
        self.dirty[id(node)] = node

    def _tracked(self, call: Call, fd: Fd) -> _Open | None:
        opened = self.fds.get(fd.num)
        if opened is None and self._under(fd.path.removesuffix(" (deleted)")):
            raise AssertionError(f"strace line {call.line}: {call.name} on {fd.path}, opened "
                                 "by a call the model does not follow")
        return opened

    def _open_path(self, call: Call, path: str, flags: str, fd: Fd) -> None:
        self.fds.pop(fd.num, None)
        if not self._under(path):
            return
        if "O_TMPFILE" in flags:
            raise NotImplementedError(f"strace line {call.line}: O_TMPFILE")
        node = self._lookup(path)
        if node is None:
            if "O_CREAT" not in flags:
                raise AssertionError(f"strace line {call.line}: {path} opened, not in the model")
            node = Node(False)
            parent, name = self._parent(path, call.line)
            self._pend(parent, ("link", name, node))
        elif "O_TRUNC" in flags and not node.is_dir:
            self._pend(node, ("truncate", 0))
        self.fds[fd.num] = _Open(node, 0, "O_APPEND" in flags)

    def _openat(self, call: Call, base: Fd, raw: bytes, flags: str, *mode: object) -> None:
        self._open_path(call, self._path(base, raw), flags, call.ret)

    def _open(self, call: Call, raw: bytes, flags: str, *mode: object) -> None:
        self._open_path(call, self._path(None, raw), flags, call.ret)

    def _creat(self, call: Call, raw: bytes, mode: object) -> None:
        self._open_path(call, self._path(None, raw), "O_WRONLY|O_CREAT|O_TRUNC", call.ret)

    def _write_at(self, call: Call, fd: Fd, data: bytes, off: int | None) -> None:
        if fd.path == MARKER_FILE and data.startswith(ACK):
            self.acks.append(data[len(ACK):].decode().strip())
            return
        opened = self._tracked(call, fd)
        if opened is None:
            return
        data = data[: call.ret]
        if off is None:
            off = len(opened.node.data) if opened.append else opened.pos
            opened.pos = off + len(data)
        if data:
            self._pend(opened.node, ("write", off, data))

    def _write(self, call: Call, fd: Fd, data: bytes, n: int) -> None:
        self._write_at(call, fd, data, None)

    def _pwrite64(self, call: Call, fd: Fd, data: bytes, n: int, off: int) -> None:
        self._write_at(call, fd, data, off)

    def _writev(self, call: Call, fd: Fd, iov: str, n: int) -> None:
        self._write_at(call, fd, iovec_bytes(iov), None)

    def _pwritev(self, call: Call, fd: Fd, iov: str, n: int, off: int, *flags: object) -> None:
        self._write_at(call, fd, iovec_bytes(iov), None if off == -1 else off)

    _pwritev2 = _pwritev

    def _lseek(self, call: Call, fd: Fd, off: int, whence: str) -> None:
        opened = self._tracked(call, fd)
        if opened is not None:
            opened.pos = call.ret

    def _ftruncate(self, call: Call, fd: Fd, size: int) -> None:
        opened = self._tracked(call, fd)
        if opened is not None:
            self._pend(opened.node, ("truncate", size))

    def _truncate(self, call: Call, raw: bytes, size: int) -> None:
        path = self._path(None, raw)
        if self._under(path):
            self._pend(self._lookup(path), ("truncate", size))

    def _fsync(self, call: Call, fd: Fd) -> None:
        opened = self._tracked(call, fd)
        if opened is not None:
            opened.node.sync()
            self.dirty.pop(id(opened.node), None)

    _fdatasync = _fsync

    def _sync(self, call: Call, *args: object) -> None:
        for node in self.dirty.values():
            node.sync()
        self.dirty.clear()

    _syncfs = _sync

    def _mkdir_path(self, call: Call, path: str) -> None:
        if self._under(path):
            parent, name = self._parent(path, call.line)
            self._pend(parent, ("link", name, Node(True)))

    def _mkdir(self, call: Call, raw: bytes, mode: object) -> None:
        self._mkdir_path(call, self._path(None, raw))

    def _mkdirat(self, call: Call, base: Fd, raw: bytes, mode: object) -> None:
        self._mkdir_path(call, self._path(base, raw))

    def _rename_paths(self, call: Call, src: str, dst: str) -> None:
        if not (self._under(src) or self._under(dst)):
            return
        (sp, sname), (dp, dname) = self._parent(src, call.line), self._parent(dst, call.line)
        if sp is not dp:
            raise NotImplementedError(f"strace line {call.line}: a rename across directories")
        self._pend(sp, ("rename", sname, dname))

    def _rename(self, call: Call, src: bytes, dst: bytes) -> None:
        self._rename_paths(call, self._path(None, src), self._path(None, dst))

    def _renameat(self, call: Call, sb: Fd, src: bytes, db: Fd, dst: bytes, *flags: str) -> None:
        if flags and "RENAME_EXCHANGE" in str(flags[0]):
            raise NotImplementedError(f"strace line {call.line}: RENAME_EXCHANGE")
        self._rename_paths(call, self._path(sb, src), self._path(db, dst))

    _renameat2 = _renameat

    def _unlink_path(self, call: Call, path: str) -> None:
        if self._under(path):
            parent, name = self._parent(path, call.line)
            self._pend(parent, ("unlink", name))

    def _unlink(self, call: Call, raw: bytes) -> None:
        self._unlink_path(call, self._path(None, raw))

    _rmdir = _unlink

    def _unlinkat(self, call: Call, base: Fd, raw: bytes, flags: object) -> None:
        self._unlink_path(call, self._path(base, raw))

    def _close(self, call: Call, fd: Fd) -> None:
        self.fds.pop(fd.num, None)

    def _dup_to(self, old: Fd, new: int) -> None:
        if old.num in self.fds:
            self.fds[new] = self.fds[old.num]
        else:
            self.fds.pop(new, None)

    def _dup(self, call: Call, fd: Fd) -> None:
        self._dup_to(fd, call.ret.num if isinstance(call.ret, Fd) else call.ret)

    def _dup2(self, call: Call, fd: Fd, new: object, *flags: object) -> None:
        self._dup(call, fd)

    _dup3 = _dup2

    def _fcntl(self, call: Call, fd: Fd, cmd: str, *args: object) -> None:
        if cmd.startswith("F_DUPFD"):
            self._dup(call, fd)

    def _chdir(self, call: Call, raw: bytes) -> None:
        self.cwd = self._path(None, raw)

    def _fchdir(self, call: Call, fd: Fd) -> None:
        self.cwd = fd.path

    def _clone(self, call: Call, *args: object) -> None:
        if "CLONE_THREAD" not in str(args):
            self.children.add(call.ret.num if isinstance(call.ret, Fd) else call.ret)

    _clone3 = _fork = _vfork = _clone

    def _touches(self, call: Call) -> bool:
        return any(isinstance(a, Fd) and self._under(a.path) for a in call.args) or any(
            isinstance(a, bytes) and self._under(self._path(None, a)) for a in call.args
            if call.name not in ("write", "pwrite64"))

    def _mmap(self, call: Call, addr: object, size: int, prot: str, flags: str, fd: object,
              off: int) -> None:
        if isinstance(fd, Fd) and fd.num in self.fds and "PROT_WRITE" in prot \
                and "MAP_SHARED" in flags:
            raise NotImplementedError(f"strace line {call.line}: a shared writable mapping")

    def _unmodelled(self, call: Call, *args: object) -> None:
        if self._touches(call):
            raise NotImplementedError(f"strace line {call.line}: no model for {call.name}")

    _link = _linkat = _symlink = _symlinkat = _fallocate = _unmodelled
    _copy_file_range = _sendfile = _splice = _unmodelled

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
