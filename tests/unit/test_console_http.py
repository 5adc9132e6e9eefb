"""The console's HTTP side on a real metrics endpoint (``MetricsServer`` with the console's
routes, on a free loopback port), without a cluster: the static page, the state with and
without tokens (401 without one, 403 for the node role, 200 for every read role), the
security headers, and /metrics and the endpoint's bounds unchanged beside it.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from raftwal.node.console import STATIC_FILES, ConsoleFeed, ConsoleRoutes
from raftwal.node.metrics_http import MetricsServer
from raftwal.node.security import ROLES, TokenTable
from tests.timing import scaled

TOKENS = {role: f"{role}-token-0123456789abcdef" for role in ROLES}
TABLE = TokenTable.parse("".join(f"{r} {t}\n" for r, t in TOKENS.items()), "tokens")
SNAPSHOT = {"generated_at_ms": 1, "members": [{"node_id": "n1"}]}
TIMEOUT_S = scaled(5.0)


def serve(tokens: TokenTable | None, published: bool = True) -> MetricsServer:
    feed = ConsoleFeed()
    if published:
        feed.publish(json.dumps(SNAPSHOT).encode())
    routes = ConsoleRoutes(feed, tokens)
    return MetricsServer(
        "127.0.0.1", 0, lambda: (b"raftwal_up 1\n", "text/plain"), routes=routes
    ).start()


@pytest.fixture
def open_server() -> Iterator[MetricsServer]:
    server = serve(None)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def token_server() -> Iterator[MetricsServer]:
    server = serve(TABLE)
    try:
        yield server
    finally:
        server.stop()


def get(server: MetricsServer, path: str, token: str | None = None) -> tuple[int, bytes, dict]:
    host, port = server.address
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def test_the_page_is_self_contained(open_server) -> None:
    for path in STATIC_FILES:
        status, body, headers = get(open_server, path)
        assert status == 200, path
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert headers["X-Frame-Options"] == "DENY"
        # Nothing from elsewhere: no absolute URL to load anything from.
        assert b"http://" not in body and b"https://" not in body and b"//cdn" not in body
    status, page, _ = get(open_server, "/console")
    assert b'src="/console/app.js"' in page and b"<script>" not in page


def test_without_tokens_the_state_is_open(open_server) -> None:
    status, body, headers = get(open_server, "/console/state.json")
    assert status == 200
    assert json.loads(body) == SNAPSHOT
    assert headers["Cache-Control"] == "no-store"
    # /metrics answers as before, beside the console.
    status, body, _ = get(open_server, "/metrics")
    assert (status, body) == (200, b"raftwal_up 1\n")
    assert get(open_server, "/console/nope")[0] == 404


def test_with_tokens_the_state_needs_a_read_role(token_server) -> None:
    status, body, _ = get(token_server, "/console/state.json")
    assert status == 401
    assert "no bearer token" in json.loads(body)["error"]
    assert SNAPSHOT["members"][0]["node_id"].encode() not in body
    status, body, _ = get(token_server, "/console/state.json", token="not-a-token-at-all-123")
    assert status == 401 and b"unknown bearer token" in body
    status, body, _ = get(token_server, "/console/state.json", token=TOKENS["node"])
    assert status == 403 and b"role node may not read the console" in body
    for role in ("reader", "consumer", "producer", "admin"):
        status, body, _ = get(token_server, "/console/state.json", token=TOKENS[role])
        assert status == 200, role
        assert json.loads(body) == SNAPSHOT
    # A refusal never echoes a token.
    status, body, _ = get(token_server, "/console/state.json", token=TOKENS["node"])
    assert TOKENS["node"].encode() not in body
    # The page itself holds no data and loads without a token (it then asks for one).
    assert get(token_server, "/console")[0] == 200


def test_before_the_first_snapshot_the_state_says_so() -> None:
    server = serve(None, published=False)
    try:
        status, body, _ = get(server, "/console/state.json")
        assert status == 503 and json.loads(body)["pending"] is True
    finally:
        server.stop()


def test_the_endpoint_keeps_its_request_bound(token_server) -> None:
    """A request head past max_request_bytes is refused with 431, also on console paths."""
    host, port = token_server.address
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"GET /console/state.json HTTP/1.1\r\nX-Pad: " + b"a" * 9000)
        answer = sock.recv(100)
    assert answer.startswith(b"HTTP/1.1 431")
    assert token_server.refused["request_too_large"] == 1
