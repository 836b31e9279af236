"""Following a program's system calls (decoded by `syscall_trace`) onto a simulated `Disk`.

Which calls change what: a create (``openat`` with ``O_CREAT`` of a new name), ``mkdir``,
``rename`` and ``unlink`` change a directory; ``write``, ``pwrite64``, ``writev``, ``pwritev``,
``ftruncate`` and ``O_TRUNC`` change a file (at the descriptor's offset, which ``lseek`` and the
writes move, or at the end with ``O_APPEND``); ``fsync`` and ``fdatasync`` make a file's or a
directory's changes durable, ``sync`` everything. Paths outside the root are followed only as far
as descriptors go. What the model cannot follow is refused, never guessed: a hard link, a shared
writable mapping, ``fallocate`` or ``copy_file_range`` under the root, a rename across
directories, a forked process changing the root, a descriptor under the root that was opened by
a call not traced.

A write of ``ACK`` + a call's name to ``MARKER_FILE`` is no change: it marks that call as
acknowledged (the traced programs write it right after each call returns).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tests.support.disk_model import Disk, Node
from tests.support.syscall_trace import Call, Fd, iovec_bytes

ACK = b"replaylake-ack "      # a traced program marks each acknowledged call by writing this
MARKER_FILE = "/dev/null"     # ... followed by the call's name, to this file
SYNCS = ("fsync", "fdatasync")


@dataclass
class _Open:
    node: Node
    pos: int = 0
    append: bool = False


class Replay:
    """Applies a program's calls to ``disk``; ``acks`` names the calls acknowledged so far."""

    def __init__(self, disk: Disk, cwd: str | os.PathLike):
        self.disk = disk
        self.cwd = str(cwd)
        self.fds: dict[int, _Open] = {}
        self.acks: list[str] = []
        self.children: set[int] = set()        # processes the program forked (followed: no)

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

    def _path(self, base: Fd | None, raw: bytes) -> str:
        name = os.fsdecode(raw)
        start = self.cwd if base is None or base.num is None and not base.path else base.path
        return os.path.normpath(os.path.join(start, name))

    def _parent(self, path: str, line: int) -> tuple[Node, str]:
        parent = self.disk.lookup(os.path.dirname(path))
        if parent is None or not parent.is_dir:
            raise AssertionError(f"strace line {line}: {path}'s directory is not in the model")
        return parent, os.path.basename(path)

    def _tracked(self, call: Call, fd: Fd) -> _Open | None:
        opened = self.fds.get(fd.num)
        if opened is None and self.disk.under(fd.path.removesuffix(" (deleted)")):
            raise AssertionError(f"strace line {call.line}: {call.name} on {fd.path}, opened "
                                 "by a call the model does not follow")
        return opened

    def _open_path(self, call: Call, path: str, flags: str, fd: Fd) -> None:
        self.fds.pop(fd.num, None)
        if not self.disk.under(path):
            return
        if "O_TMPFILE" in flags:
            raise NotImplementedError(f"strace line {call.line}: O_TMPFILE")
        node = self.disk.lookup(path)
        if node is None:
            if "O_CREAT" not in flags:
                raise AssertionError(f"strace line {call.line}: {path} opened, not in the model")
            node = Node(False)
            parent, name = self._parent(path, call.line)
            self.disk.pend(parent, ("link", name, node))
        elif "O_TRUNC" in flags and not node.is_dir:
            self.disk.pend(node, ("truncate", 0))
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
            self.disk.pend(opened.node, ("write", off, data))

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
            self.disk.pend(opened.node, ("truncate", size))

    def _truncate(self, call: Call, raw: bytes, size: int) -> None:
        path = self._path(None, raw)
        if self.disk.under(path):
            self.disk.pend(self.disk.lookup(path), ("truncate", size))

    def _fsync(self, call: Call, fd: Fd) -> None:
        opened = self._tracked(call, fd)
        if opened is not None:
            self.disk.sync(opened.node)

    _fdatasync = _fsync

    def _sync(self, call: Call, *args: object) -> None:
        self.disk.sync()

    _syncfs = _sync

    def _mkdir_path(self, call: Call, path: str) -> None:
        if self.disk.under(path):
            parent, name = self._parent(path, call.line)
            self.disk.pend(parent, ("link", name, Node(True)))

    def _mkdir(self, call: Call, raw: bytes, mode: object) -> None:
        self._mkdir_path(call, self._path(None, raw))

    def _mkdirat(self, call: Call, base: Fd, raw: bytes, mode: object) -> None:
        self._mkdir_path(call, self._path(base, raw))

    def _rename_paths(self, call: Call, src: str, dst: str) -> None:
        if not (self.disk.under(src) or self.disk.under(dst)):
            return
        (sp, sname), (dp, dname) = self._parent(src, call.line), self._parent(dst, call.line)
        if sp is not dp:
            raise NotImplementedError(f"strace line {call.line}: a rename across directories")
        self.disk.pend(sp, ("rename", sname, dname))

    def _rename(self, call: Call, src: bytes, dst: bytes) -> None:
        self._rename_paths(call, self._path(None, src), self._path(None, dst))

    def _renameat(self, call: Call, sb: Fd, src: bytes, db: Fd, dst: bytes, *flags: str) -> None:
        if flags and "RENAME_EXCHANGE" in str(flags[0]):
            raise NotImplementedError(f"strace line {call.line}: RENAME_EXCHANGE")
        self._rename_paths(call, self._path(sb, src), self._path(db, dst))

    _renameat2 = _renameat

    def _unlink_path(self, call: Call, path: str) -> None:
        if self.disk.under(path):
            parent, name = self._parent(path, call.line)
            self.disk.pend(parent, ("unlink", name))

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
        return any(isinstance(a, Fd) and self.disk.under(a.path) for a in call.args) or any(
            isinstance(a, bytes) and self.disk.under(self._path(None, a)) for a in call.args
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
