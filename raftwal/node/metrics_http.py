"""The node's ``/metrics`` HTTP endpoint: one thread, one selector, bounded in every way.

prometheus_client's own server gives each connection a thread with no read deadline and
listens with a backlog of 5: a few hundred half-sent requests held open pin as many threads,
and dropping them at once stalled the node long enough to lose Raft leadership. Here one
daemon thread serves every connection from a selector:

- at most ``max_connections`` are open; past that a new connection takes the place of the
  oldest one still sending its request (so half-sent requests held open cannot lock a
  scraper out), or is closed at once when every open one is being answered;
- a request must arrive whole (``max_request_bytes``) within ``read_timeout_s`` of the
  connection, and the answer must leave within ``write_timeout_s``; either miss closes it;
- only ``GET /metrics`` (and ``/``) answer 200, and the paths the optional ``routes``
  answer (the console, ``raftwal.node.console``, which only hands out bytes it already
  has); anything else gets a short 4xx;
- one request per connection (``Connection: close``), so nothing lingers.

Rendering the registry happens on this thread, so a scrape costs what it costs and no
more; everything else it does is a few syscalls per connection. It must never block on a
peer, grow without bound, or raise out of its loop (an error closes that one connection).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 8192
LISTEN_BACKLOG = 128
# How often the loop wakes to close connections past their deadline.
TICK_S = 0.25


class RouteAnswer(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def content_type(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


#: (path, request headers with lower-case names) -> an answer, or None for "not mine".
Routes = Callable[[str, Mapping[str, str]], RouteAnswer | None]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _headers(head: bytes) -> dict[str, str]:
    """The header fields of a request head (after its request line), names lower-cased;
    a repeated name keeps its first value."""
    fields: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            fields.setdefault(
                name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")
            )
    return fields


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    deadline: float
    request: bytearray = field(default_factory=bytearray)
    response: memoryview | None = None


class MetricsServer:
    """Serves ``render()`` (bytes in the Prometheus text format) at ``/metrics``."""

    def __init__(
        self,
        host: str,
        port: int,
        render: Callable[[], tuple[bytes, str]],
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        routes: Routes | None = None,
    ) -> None:
        self._render = render
        self._routes = routes
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_request_bytes = max_request_bytes
        self._listener = socket.create_server(
            (host, port), backlog=LISTEN_BACKLOG, reuse_port=False
        )
        self._listener.setblocking(False)
        self.address = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._connections: dict[int, _Connection] = {}
        self._stop = threading.Event()
        #: connections closed without an answer, by reason (read from any thread)
        self.refused: dict[str, int] = dict.fromkeys(
            ("too_many_connections", "read_timeout", "write_timeout", "request_too_large"), 0
        )
        self._thread = threading.Thread(target=self._run, name="raftwal-metrics", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        for connection in list(self._connections.values()):
            self._close(connection)
        with contextlib.suppress(OSError):
            self._selector.close()
        self._listener.close()

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(TICK_S)
            except OSError:
                if self._stop.is_set():
                    return
                raise
            for key, mask in events:
                if key.data is None:
                    self._accept()
                    continue
                connection = key.data
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(connection)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(connection)
                except OSError:
                    self._close(connection)
                except Exception:  # noqa: BLE001 (that connection ends; the server goes on)
                    log.exception("metrics endpoint failed on one connection")
                    self._close(connection)
            self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.warning("metrics endpoint cannot accept: %s", error)
                return
            if len(self._connections) >= self.max_connections and not self._evict_oldest():
                self.refused["too_many_connections"] += 1
                sock.close()
                continue
            sock.setblocking(False)
            connection = _Connection(sock, time.monotonic() + self.read_timeout_s)
            self._connections[sock.fileno()] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _evict_oldest(self) -> bool:
        """Make room by closing the oldest connection still sending its request (what
        half-sent requests held open look like): a scraper, which sends its request at
        once, then always gets in. False when every connection is being answered."""
        waiting = [c for c in self._connections.values() if c.response is None]
        if not waiting:
            return False
        self.refused["too_many_connections"] += 1
        self._close(min(waiting, key=lambda c: c.deadline))
        return True

    def _read(self, connection: _Connection) -> None:
        data = connection.sock.recv(4096)
        if not data:
            self._close(connection)
            return
        connection.request += data
        end = connection.request.find(b"\r\n\r\n")
        if end < 0:
            if len(connection.request) > self.max_request_bytes:
                self.refused["request_too_large"] += 1
                self._answer(connection, 431, b"request header too large\n", "text/plain")
            return
        request_line = bytes(connection.request[: connection.request.find(b"\r\n")])
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._answer(connection, 400, b"bad request\n", "text/plain")
        elif parts[0] != b"GET":
            self._answer(connection, 405, b"only GET\n", "text/plain")
        else:
            path = parts[1].split(b"?", 1)[0]
            if path in (b"/metrics", b"/"):
                body, content_type = self._render()
                self._answer(connection, 200, body, content_type)
                return
            routed = None
            if self._routes is not None:
                routed = self._routes(
                    path.decode("latin-1"), _headers(bytes(connection.request[:end]))
                )
            if routed is None:
                self._answer(connection, 404, b"not found: try /metrics\n", "text/plain")
            else:
                self._answer(
                    connection, routed.status, routed.body, routed.content_type, routed.headers
                )

    def _answer(
        self,
        connection: _Connection,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n"
        ).encode()
        connection.response = memoryview(head + body)
        connection.deadline = time.monotonic() + self.write_timeout_s
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._write(connection)

    def _write(self, connection: _Connection) -> None:
        assert connection.response is not None
        try:
            sent = connection.sock.send(connection.response)
        except BlockingIOError:
            return
        connection.response = connection.response[sent:]
        if not connection.response:
            self._close(connection)

    def _expire(self, now: float) -> None:
        for connection in list(self._connections.values()):
            if now > connection.deadline:
                late = "write_timeout" if connection.response is not None else "read_timeout"
                self.refused[late] += 1
                self._close(connection)

    def _close(self, connection: _Connection) -> None:
        fileno = connection.sock.fileno()
        if fileno >= 0:
            self._connections.pop(fileno, None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(connection.sock)
        with contextlib.suppress(OSError):
            connection.sock.close()
