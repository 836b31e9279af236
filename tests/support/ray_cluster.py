"""A real multi-node Ray cluster on this host, for the test session: a head and more raylets
started with `ray start`, each on its own loopback address with its own resources.

Each node is one `ray start --block` process (in its own session): it owns the node's raylet,
object store and agents, and on SIGTERM it drains and stops exactly those. So the cluster is
stopped without `ray stop`, which would end every Ray process of the machine (another session's
too). Every node's files live under one fresh temp dir, whose path is on the command line of each
Ray process the cluster starts: `survivors()` finds any that outlived `stop()`.

Nodes bind distinct loopback addresses (127.0.0.2, 127.0.0.3, ...; not 127.0.0.1, which Ray
replaces with the host's outward address), so two raylets on one host never share an address and
a driver connecting to the head's address attaches to the head's raylet. Every port is picked
free.
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RAY = str(Path(sys.executable).with_name("ray"))


@dataclass(frozen=True)
class NodeSpec:
    """One node: its loopback address, CPUs and custom resources."""
    ip: str
    num_cpus: int
    resources: dict[str, float] = field(default_factory=dict)


def auth_env() -> dict[str, str]:
    """Token authentication with a token of this process's own (not ``~/.ray/auth_token``, which
    another session may share), set in ``os.environ``: Ray reads it once, when ray is first
    imported, so the test session calls this before anything imports ray."""
    key = "RAY_AUTH_TOKEN_PATH"
    if os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get(key, "").startswith(
            "/tmp/rlray-auth-"):
        return {"RAY_AUTH_MODE": "token", key: os.environ[key]}
    token = Path(tempfile.mkdtemp(prefix="rlray-auth-", dir="/tmp")) / "auth_token"
    atexit.register(shutil.rmtree, token.parent, True)
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {"RAY_AUTH_MODE": "token", key: str(token)}
    os.environ.update(env)
    return env


def _free_port(ip: str) -> int:
    return _free_ports(ip, 1)[0]


def _free_ports(ip: str, n: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """``n`` distinct free ports of ``ip``, none in ``avoid``: every socket is held open until
    all are picked (ports picked one at a time, each socket closed before the next, can come
    back the same, and Ray refuses a node whose components share a port)."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < n:
            s = socket.socket()
            sockets.append(s)
            s.bind((ip, 0))
            if s.getsockname()[1] in avoid:       # keep it bound (so it is not drawn again)
                n += 1
        return [s.getsockname()[1] for s in sockets if s.getsockname()[1] not in avoid]
    finally:
        for s in sockets:
            s.close()


class LocalCluster:
    """Start the nodes (`start`), give the driver's address (`address`), stop them (`stop`).

    The cluster uses token authentication (Ray's default for `ray start`) with the token of
    `auth_env`, which the driver's environment must hold before it first imports ray."""

    def __init__(self, head: NodeSpec, others: list[NodeSpec]):
        self.head, self.others = head, others
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlray-", dir="/tmp"))  # short: socket paths
        self.port = _free_port(head.ip)
        self.env = auth_env()
        self.procs: dict[str, subprocess.Popen] = {}
        self.start_s = self.stop_s = 0.0
        self.started_at = time.monotonic()

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{self.port}"

    def _args(self, node: NodeSpec) -> list[str]:
        options = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                   "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                   "--metrics-export-port", "--dashboard-port")
        # all distinct, and none the head's own port (a clash stops the node before it starts)
        ports = dict(zip(options, _free_ports(node.ip, len(options), frozenset({self.port}))))
        dashboard = ports.pop("--dashboard-port")
        args = [RAY, "start", "--block", "--disable-usage-stats", f"--node-ip-address={node.ip}",
                f"--num-cpus={node.num_cpus}", f"--resources={json.dumps(node.resources)}",
                f"--temp-dir={self.temp_dir}", *(f"{k}={v}" for k, v in ports.items())]
        if node is self.head:
            return [*args, "--head", f"--port={self.port}", "--include-dashboard=false",
                    f"--dashboard-port={dashboard}"]
        return [*args, f"--address={self.address}"]

    def _launch(self, node: NodeSpec) -> None:
        log = open(self.temp_dir / f"ray-start-{node.ip}.log", "wb")
        self.procs[node.ip] = subprocess.Popen(self._args(node), stdout=log, stderr=subprocess.STDOUT,
                                               env={**os.environ, **self.env},
                                               start_new_session=True)
        log.close()

    def start(self, timeout: float = 120.0) -> LocalCluster:
        """Start every node at once (the head's address is known before it runs: the others
        keep trying to join it until it is up), and return once the head has written its
        address; `wait_for_nodes` tells when the others have joined."""
        self.started_at = t0 = time.monotonic()
        for node in (self.head, *self.others):
            self._launch(node)
        self._wait(lambda: (self.temp_dir / "ray_current_cluster").exists(), timeout,
                   "the head node")
        self.start_s = time.monotonic() - t0
        return self

    def wait_for_nodes(self, ray: Any, timeout: float = 120.0) -> None:
        """Return once the connected driver sees every node alive."""
        want = 1 + len(self.others)
        self._wait(lambda: sum(n["Alive"] for n in ray.nodes()) == want, timeout, "every node")

    def add(self, ray: Any, node: NodeSpec, timeout: float = 120.0) -> str:
        """Start one more node into the running cluster; return its node id once it is alive."""
        self.others.append(node)
        self._launch(node)
        self._wait(lambda: any(n["Alive"] and n["NodeManagerAddress"] == node.ip
                               for n in ray.nodes()), timeout, f"the node at {node.ip}")
        [node_id] = [n["NodeID"] for n in ray.nodes()
                     if n["Alive"] and n["NodeManagerAddress"] == node.ip]
        return node_id

    def kill_raylet(self, node: NodeSpec) -> int:
        """SIGKILL ``node``'s raylet, as a crash or the kernel's OOM killer would end it; return
        its pid. Its workers (and the node's other processes) go down with it."""
        import psutil
        mine = str(self.temp_dir)
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            cmd = proc.info["cmdline"] or ()
            if (proc.info["name"] == "raylet" or (cmd and Path(cmd[0]).name == "raylet")) and \
                    any(mine in part for part in cmd) and any(f"={node.ip}" in part for part in cmd):
                proc.kill()
                return proc.info["pid"]
        raise RuntimeError(f"no raylet of this cluster runs at {node.ip}")

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not ready():
            dead = {ip: p.returncode for ip, p in self.procs.items() if p.poll() is not None}
            if dead or time.monotonic() > end:
                self.stop()
                logs = "\n".join(p.read_text(errors="replace")[-2000:]
                                 for p in self.temp_dir.glob("ray-start-*.log"))
                raise RuntimeError(f"the local Ray cluster did not start ({what}; exited: {dead})"
                                   f"\n{logs}")
            time.sleep(0.5)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM each node's `ray start` (the others first, then the head) and wait; whatever
        of this cluster is still running after ``timeout`` is killed."""
        t0 = time.monotonic()
        for ip in reversed(list(self.procs)):
            proc = self.procs[ip]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        end = time.monotonic() + timeout
        while self.survivors() and time.monotonic() < end:
            time.sleep(0.2)
        for pid in self.survivors():
            os.kill(pid, signal.SIGKILL)
        self.stop_s = time.monotonic() - t0

    def survivors(self) -> list[int]:
        """Pids of processes still running whose command line names this cluster's temp dir."""
        import psutil
        mine = str(self.temp_dir)
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE and \
                        any(mine in part for part in proc.info["cmdline"] or ()):
                    found.append(proc.info["pid"])
            except psutil.Error:
                pass
        return found

    def cleanup(self) -> None:
        shutil.rmtree(self.temp_dir, ignore_errors=True)
