"""Hosts in network namespaces: each node of a dev cluster (``raftwal dev up --netns``)
gets a Linux network namespace of its own, with its own address on a private bridge, so
that a cluster runs across distinct, non-loopback IP addresses on one machine, as it
would across machines.

Layout, for a tag ``T`` (6 hex digits, random, so that several clusters and test workers
never collide):

- a bridge ``rwbT`` in the initial namespace with ``10.199.X.1/24`` (X picked among the
  subnets no interface uses); the nodes are reachable from this machine only;
- per host ``k`` (1-based), a namespace ``rwT-<id>`` whose ``eth0`` (a veth pair, the
  other end ``rwvT<k>`` on the bridge) has ``10.199.X.(10+k)``, and its own loopback;
- a process runs in a host with ``ip netns exec``, which execs it (its pid is the
  process's own).

``destroy`` removes the namespaces (which removes their veths) and the bridge; it is
idempotent and also runs when ``create`` fails half-way. Needs root (CAP_NET_ADMIN) and
iproute2: ``unavailable()`` says why not where they are missing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

SUBNET_PREFIX = "10.199"
FIRST_HOST = 10
NETNS_DIR = "/run/netns"


class NetnsError(RuntimeError):
    """A namespace, a link or an address could not be made (the message has the command
    and its error)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def unavailable() -> str | None:
    """Why hosts in namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian's iproute2 package)"
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_NET_ADMIN"
    probe = f"rwprobe{secrets.token_hex(3)}"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"cannot create a network namespace ({result.stderr.strip()})"
    _ip("netns", "del", probe, check=False)
    return None


def _used_subnets() -> set[int]:
    text = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    used = set()
    for word in text.split():
        if word.startswith(f"{SUBNET_PREFIX}."):
            with contextlib.suppress(ValueError, IndexError):
                used.add(int(word.split(".")[2].split("/")[0]))
    return used


@dataclass(frozen=True)
class NetnsHosts:
    """Hosts (node ids, in order) in namespaces tagged `tag`, on subnet 10.199.`subnet`."""

    tag: str
    subnet: int
    node_ids: tuple[str, ...]

    @property
    def bridge(self) -> str:
        return f"rwb{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    def namespace(self, node_id: str) -> str:
        return f"rw{self.tag}-{node_id}"

    def address(self, node_id: str) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{FIRST_HOST + 1 + self.node_ids.index(node_id)}"

    def _veth(self, node_id: str) -> str:
        return f"rwv{self.tag}{self.node_ids.index(node_id) + 1}"

    def command(self, node_id: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `node_id`'s namespace."""
        return ["ip", "netns", "exec", self.namespace(node_id), *argv]

    def _make_host(self, node_id: str) -> None:
        namespace = self.namespace(node_id)
        _ip("netns", "add", namespace)
        veth = self._veth(node_id)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", namespace, "addr", "add", f"{self.address(node_id)}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "route", "add", "default", "via", self.gateway)

    def add_host(self, node_id: str) -> NetnsHosts:
        """One more host on the same bridge (the next address); these hosts plus it."""
        if node_id in self.node_ids or len(self.node_ids) >= 200:
            raise NetnsError(
                f"cannot add host {node_id!r} (have {', '.join(self.node_ids)}; expected a new "
                "id, at most 200 hosts)"
            )
        hosts = NetnsHosts(self.tag, self.subnet, (*self.node_ids, node_id))
        try:
            hosts._make_host(node_id)
        except BaseException:
            _ip("netns", "del", hosts.namespace(node_id), check=False)
            raise
        return hosts

    def set_connected(self, node_id: str, connected: bool) -> None:
        """Cut `node_id`'s host off the bridge (its veth down: a partition of that machine
        from every other host and from this one), or connect it again."""
        _ip("link", "set", self._veth(node_id), "up" if connected else "down")

    def exists(self) -> bool:
        return any(os.path.exists(f"{NETNS_DIR}/{self.namespace(n)}") for n in self.node_ids)

    def destroy(self) -> None:
        """Remove every namespace and the bridge (what exists of them)."""
        for node_id in self.node_ids:
            _ip("netns", "del", self.namespace(node_id), check=False)
        _ip("link", "del", self.bridge, check=False)

    def to_json(self) -> dict[str, object]:
        return {"tag": self.tag, "subnet": self.subnet, "node_ids": list(self.node_ids)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> NetnsHosts:
        node_ids = data["node_ids"]
        assert isinstance(node_ids, list)
        return cls(str(data["tag"]), int(str(data["subnet"])), tuple(str(n) for n in node_ids))


def create(node_ids: Sequence[str]) -> NetnsHosts:
    """A namespace per node id on a new bridge; all removed again if any step fails."""
    reason = unavailable()
    if reason is not None:
        raise NetnsError(f"network namespaces are not available here: {reason}")
    if not 1 <= len(node_ids) <= 200:
        raise NetnsError(f"invalid host count ({len(node_ids)}; expected 1..200)")
    free = sorted(set(range(1, 255)) - _used_subnets())
    if not free:
        raise NetnsError(f"no free subnet in {SUBNET_PREFIX}.1-254.0/24")
    hosts = NetnsHosts(secrets.token_hex(3), free[secrets.randbelow(len(free))], tuple(node_ids))
    try:
        _ip("link", "add", hosts.bridge, "type", "bridge")
        _ip("addr", "add", f"{hosts.gateway}/24", "dev", hosts.bridge)
        _ip("link", "set", hosts.bridge, "up")
        for node_id in node_ids:
            hosts._make_host(node_id)
    except BaseException:
        hosts.destroy()
        raise
    return hosts
