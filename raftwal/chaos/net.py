"""Per-link TCP proxies for the chaos suite (``raftwal chaos``): the network the nemesis cuts.

Every node dials every peer through a proxy of its own, one per directed link and port kind
(``raft``, ``grpc`` and ``transfer``, the port that carries replication's Append streams,
and each data worker's gRPC and transfer ports, ``wgrpc<k>`` and ``wtransfer<k>``),
configured with the node's ``peer_raft_addresses`` / ``peer_grpc_addresses`` /
``peer_transfer_addresses`` (raftwal/node/config.py). Clients still reach every node
directly, as in Jepsen: a partition separates the servers from each other, for Raft and WAL
replication traffic alike, not the clients from the servers.

A link is ``open``, ``reset`` (its connections are aborted with a TCP RST and new ones are
accepted and reset at once: a peer that refuses) or ``drop`` (nothing is forwarded either
way and new connections are held unconnected: a black hole; TCP buffers fill, timeouts
decide). Healing a dropped link resumes forwarding where it stopped, as a real network
does after a transient outage.

``set_latency(delay_ms, jitter_ms)`` delays what every link forwards, each way, by
``delay_ms`` plus a normally distributed jitter (standard deviation ``jitter_ms``, never
below zero), keeping each connection's bytes in order: a round trip between two nodes
then takes about twice the delay (``bench/latency.py`` sets it to RTT / 2).

``SiteLink`` puts the same proxies between two sites on one machine: in front of one
cluster's gRPC and transfer ports, on a loopback address of that site's own (127.0.0.2),
so that what another cluster sends it crosses a delayed link (bench/replicate.py).

The proxies run on their own thread and event loop, so a busy workload cannot delay the
traffic they carry. This module must never listen on or forward to anything but
loopback addresses (127.0.0.1, and a site's 127.x.y.z), nor touch a connection it did not
accept itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from raftwal.cli.dev import NodeConfig, free_ports

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
LINK_KINDS = ("raft", "grpc", "transfer")
LINK_MODES = ("reset", "drop")
# Bytes read per forwarding step, and the bound of a connection attempt to the real port.
CHUNK_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 2.0
# Chunks read but not yet forwarded, per direction of a connection (a delayed link's
# in-flight bytes: at most this many CHUNK_BYTES reads; the reader then waits).
DELAY_QUEUE_CHUNKS = 64
# Bound of every control call into the proxy thread.
CONTROL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Link:
    """`source` dials `target`'s `kind` port."""

    source: str
    target: str
    kind: str


# A data worker's ports (DESIGN.md section 2): "wgrpc<k>" is worker k's gRPC port,
# "wtransfer<k>" its transfer port. Worker 0's transfer port is the node's transfer_port
# ("transfer"). Only workers with fixed ports (`worker_grpc_ports`, as `dev.make_config`
# gives them) can be proxied.
WORKER_GRPC = "wgrpc"
WORKER_TRANSFER = "wtransfer"


def _worker_kinds(node: NodeConfig) -> list[str]:
    kinds = [f"{WORKER_GRPC}{k}" for k, port in enumerate(node.worker_grpc_ports) if port > 0]
    kinds += [
        f"{WORKER_TRANSFER}{k}"
        for k, port in enumerate(node.worker_transfer_ports)
        if k > 0 and port > 0
    ]
    return kinds


def _upstream_port(node: NodeConfig, kind: str) -> int:
    if kind.startswith(WORKER_GRPC):
        return node.worker_grpc_ports[int(kind[len(WORKER_GRPC) :])]
    if kind.startswith(WORKER_TRANSFER):
        return node.worker_transfer_ports[int(kind[len(WORKER_TRANSFER) :])]
    return {"raft": node.raft_port, "grpc": node.grpc_port, "transfer": node.transfer_port}[kind]


class _Connection:
    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                # SO_LINGER 0: close() sends a RST, as a crashed or refusing peer would.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class _LinkProxy:
    """One listening port forwarding to one node's real port; lives on the proxy loop."""

    def __init__(
        self, link: Link, listen_port: int, upstream_port: int, listen_host: str = HOST
    ) -> None:
        self.link = link
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.mode = "open"
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.connections: set[_Connection] = set()
        self.accepted = 0
        self.reset = 0
        # One-way delay of what this link forwards, and its jitter (s).
        self.delay_s = 0.0
        self.jitter_s = 0.0
        self._random = random.Random(f"{link.source}-{link.target}-{link.kind}")
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.abort()
        self.connections.clear()
        self.flowing.set()

    def cut(self, mode: str) -> None:
        assert mode in LINK_MODES, mode
        self.mode = mode
        if mode == "reset":
            self.flowing.set()
            for connection in list(self.connections):
                connection.abort()
                self.reset += 1
            self.connections.clear()
        else:
            self.flowing.clear()

    def heal(self) -> None:
        self.mode = "open"
        self.flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer)
        self.accepted += 1
        if self.mode == "reset":
            connection.abort()
            self.reset += 1
            return
        self.connections.add(connection)
        try:
            # A dropped link holds a new connection unconnected until it heals (or is
            # reset or closed, which aborts the connection and cancels this task).
            await self.flowing.wait()
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.upstream_port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            # The node is down: refuse, as the node itself would.
            connection.abort()
            self.connections.discard(connection)
            return
        connection.upstream = up_writer
        if connection not in self.connections:  # reset while connecting
            connection.abort()
            return
        connection.tasks = []
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(DELAY_QUEUE_CHUNKS)
            connection.tasks += [
                asyncio.create_task(self._pump(source, queue, connection)),
                asyncio.create_task(self._deliver(queue, sink, connection)),
            ]

    def _due(self, last_due: float) -> float:
        """When bytes read now may go on: after the link's delay and jitter, and never
        before bytes read earlier (a TCP stream stays in order)."""
        jitter = self._random.gauss(0.0, self.jitter_s) if self.jitter_s > 0 else 0.0
        return max(last_due, time.monotonic() + max(0.0, self.delay_s + jitter))

    async def _pump(
        self,
        source: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes]],
        connection: _Connection,
    ) -> None:
        due = 0.0
        try:
            while True:
                await self.flowing.wait()
                data = await source.read(CHUNK_BYTES)
                if not data:
                    break
                due = self._due(due)
                await queue.put((due, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # The end of the stream follows what was read before it; with no room left to
            # say so, the connection ends now (as it did before delays, at once).
            try:
                queue.put_nowait((0.0, b""))
            except asyncio.QueueFull:
                if connection in self.connections:
                    self.connections.discard(connection)
                connection.abort()

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        sink: asyncio.StreamWriter,
        connection: _Connection,
    ) -> None:
        try:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait_s = due - time.monotonic()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                # Bytes read just before a drop wait for the heal, like a queued packet.
                await self.flowing.wait()
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            if connection in self.connections:
                self.connections.discard(connection)
                connection.abort()


class ProxyNet:
    """Proxies for every directed link of `nodes`, on a background thread (see module doc).

    ``start()`` binds them all; ``configure(nodes)`` returns the node configs with their
    peer addresses pointing at the proxies; ``cut``/``heal_all`` change links;
    ``close()`` stops everything. Safe to call from any thread.
    """

    def __init__(self, nodes: Sequence[NodeConfig]) -> None:
        for node in nodes:
            if node.host != HOST:
                raise ValueError(f"node {node.id} is on {node.host} (expected {HOST})")
        self._nodes = list(nodes)
        links = [
            Link(source.id, target.id, kind)
            for source in nodes
            for target in nodes
            if source.id != target.id
            for kind in (*LINK_KINDS, *_worker_kinds(target))
            if kind != "transfer" or target.transfer_port > 0
        ]
        # Ports free a moment ago may include the nodes' own (picked, then closed, by
        # `dev.make_config`): leave those out.
        taken = {
            port
            for n in nodes
            for port in (
                n.grpc_port,
                n.raft_port,
                n.metrics_port,
                n.transfer_port,
                *n.worker_grpc_ports,
                *n.worker_transfer_ports,
            )
        }
        ports = [p for p in free_ports(len(links) + len(taken), HOST) if p not in taken]
        self._ports = dict(zip(links, ports[: len(links)], strict=True))
        self._proxies: dict[Link, _LinkProxy] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    @property
    def links(self) -> list[Link]:
        return list(self._ports)

    def configure(self, nodes: Iterable[NodeConfig]) -> tuple[NodeConfig, ...]:
        """`nodes` with every peer dialled through its proxy."""

        def table(source: str, kind: str) -> tuple[tuple[str, str], ...]:
            return tuple(
                (link.target, f"{HOST}:{port}")
                for link, port in sorted(self._ports.items(), key=lambda item: item[0].target)
                if link.source == source and link.kind == kind
            )

        def workers(source: str, prefix: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
            by_target: dict[str, dict[int, str]] = {}
            for link, port in self._ports.items():
                if link.source == source and link.kind.startswith(prefix):
                    index = int(link.kind[len(prefix) :])
                    by_target.setdefault(link.target, {})[index] = f"{HOST}:{port}"
            return tuple(
                (target, tuple(found[k] for k in sorted(found)))
                for target, found in sorted(by_target.items())
            )

        return tuple(
            replace(
                node,
                peer_raft_addresses=table(node.id, "raft"),
                peer_grpc_addresses=table(node.id, "grpc"),
                peer_transfer_addresses=table(node.id, "transfer"),
                peer_worker_grpc_addresses=workers(node.id, WORKER_GRPC),
                peer_worker_transfer_addresses=workers(node.id, WORKER_TRANSFER),
            )
            for node in nodes
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-proxies", daemon=True)
        self._thread.start()
        if not self._started.wait(CONTROL_TIMEOUT_S):
            raise TimeoutError(f"proxies not listening after {CONTROL_TIMEOUT_S} s")

    def _listeners(self) -> list[tuple[Link, str, int, int]]:
        """(link, listen host, listen port, upstream port on 127.0.0.1) of every proxy."""
        by_id = {node.id: node for node in self._nodes}
        out = []
        for link, port in self._ports.items():
            out.append((link, HOST, port, _upstream_port(by_id[link.target], link.kind)))
        return out

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def start_all() -> None:
            for link, host, port, upstream in self._listeners():
                proxy = _LinkProxy(link, port, upstream, host)
                await proxy.start()
                self._proxies[link] = proxy

        try:
            loop.run_until_complete(start_all())
        except OSError:
            log.exception("chaos proxies could not bind")
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._close_all())
            loop.close()

    async def _close_all(self) -> None:
        for proxy in self._proxies.values():
            await proxy.close()

    def _call(self, function: object) -> None:
        loop = self._loop
        if loop is None or not self._started.is_set():
            raise RuntimeError("proxies are not running")

        async def run() -> None:
            function()  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(run(), loop).result(CONTROL_TIMEOUT_S)

    def cut(self, a: str, b: str, mode: str) -> None:
        """Cut every link between nodes `a` and `b`, both ways, every port kind."""
        if mode not in LINK_MODES:
            raise ValueError(f"invalid link mode {mode!r} (expected one of {LINK_MODES})")

        def apply() -> None:
            for link, proxy in self._proxies.items():
                if {link.source, link.target} == {a, b}:
                    proxy.cut(mode)

        self._call(apply)

    def heal_all(self) -> None:
        def apply() -> None:
            for proxy in self._proxies.values():
                proxy.heal()

        self._call(apply)

    def set_latency(self, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay what every link forwards, each way, by `delay_ms` (+ normal jitter of
        standard deviation `jitter_ms`); 0 and 0: no delay."""
        if not (0 <= delay_ms <= 10_000 and 0 <= jitter_ms <= 10_000):
            raise ValueError(
                f"invalid latency ({delay_ms} ms, jitter {jitter_ms} ms; expected 0..10000 each)"
            )

        def apply() -> None:
            for proxy in self._proxies.values():
                proxy.delay_s, proxy.jitter_s = delay_ms / 1000, jitter_ms / 1000

        self._call(apply)

    def cut_pairs(self) -> list[tuple[str, str, str]]:
        """(a, b, mode) of every cut node pair, a < b."""
        seen: dict[tuple[str, str], str] = {}
        for link, proxy in self._proxies.items():
            if proxy.mode != "open":
                pair = tuple(sorted((link.source, link.target)))
                seen[pair] = proxy.mode  # type: ignore[index]
        return [(a, b, mode) for (a, b), mode in sorted(seen.items())]

    def counters(self) -> dict[str, int]:
        return {
            "connections_accepted": sum(p.accepted for p in self._proxies.values()),
            "connections_reset": sum(p.reset for p in self._proxies.values()),
        }

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CONTROL_TIMEOUT_S)


class SiteLink(ProxyNet):
    """The link between two sites on one machine: a proxy per port of one site,
    listening on that site's own loopback address (e.g. 127.0.0.2) and forwarding to the
    same port on 127.0.0.1, where the site's servers listen; ``set_latency`` delays what
    crosses it, each way. ``site_nodes`` gives a site's raftwal nodes their configuration:
    they advertise the site's address (their ``host``), listen on 127.0.0.1
    (``listen_host``) and dial each other there (``peer_*_addresses``), so that only
    traffic from outside the site (the other cluster's replicator, clients) crosses the
    link (bench/replicate.py's round trips between sites)."""

    def __init__(self, address: str, ports: Iterable[int]) -> None:
        if not address.startswith("127.") or address == HOST:
            raise ValueError(f"invalid site address {address!r} (expected 127.x.y.z, not {HOST})")
        self.address = address
        self._nodes = []
        self._ports = {
            Link("site", address, f"port-{port}"): port for port in sorted(set(ports)) if port > 0
        }
        self._proxies = {}
        self._loop = None
        self._thread = None
        self._started = threading.Event()

    @classmethod
    def of_nodes(cls, nodes: Sequence[NodeConfig], address: str) -> SiteLink:
        """The link in front of `nodes`' gRPC and transfer ports, their data workers'
        included."""
        return cls(
            address,
            [
                p
                for n in nodes
                for p in (
                    n.grpc_port,
                    n.transfer_port,
                    *n.worker_grpc_ports,
                    *n.worker_transfer_ports,
                )
            ],
        )

    @property
    def ports(self) -> list[int]:
        """The ports the link proxies (on its address, to the same port on 127.0.0.1)."""
        return sorted(self._ports.values())

    def _listeners(self) -> list[tuple[Link, str, int, int]]:
        return [(link, self.address, port, port) for link, port in self._ports.items()]

    def site_nodes(self, nodes: Sequence[NodeConfig]) -> tuple[NodeConfig, ...]:
        """`nodes` as they run behind the link (see the class doc)."""
        return tuple(
            replace(
                node,
                host=self.address,
                listen_host=HOST,
                peer_raft_addresses=tuple(
                    (peer.id, f"{HOST}:{peer.raft_port}") for peer in nodes if peer != node
                ),
                peer_grpc_addresses=tuple(
                    (peer.id, f"{HOST}:{peer.grpc_port}") for peer in nodes if peer != node
                ),
                peer_transfer_addresses=tuple(
                    (peer.id, f"{HOST}:{peer.transfer_port}")
                    for peer in nodes
                    if peer != node and peer.transfer_port > 0
                ),
                peer_worker_grpc_addresses=tuple(
                    (peer.id, tuple(f"{HOST}:{p}" for p in peer.worker_grpc_ports))
                    for peer in nodes
                    if peer != node and peer.worker_grpc_ports
                ),
                peer_worker_transfer_addresses=tuple(
                    (peer.id, tuple(f"{HOST}:{p}" for p in peer.worker_transfer_ports))
                    for peer in nodes
                    if peer != node and peer.worker_transfer_ports
                ),
            )
            for node in nodes
        )
