"""The segment transfer port: a sealed segment's frames as raw bytes, without gRPC.

A ReadSegment call with `bulk` set is authenticated and checked like any other call. A
node that offers bulk transfers answers it with one response that carries the frames'
offsets, their crc, their size and a ticket instead of the frames. The reader then opens
a TCP connection to the node's transfer port and sends `HELLO` and the ticket; the node
answers one status byte and, when it accepted the ticket, exactly the announced bytes,
sent from the file by the kernel (`sendfile`), and closes.

A ticket is 32 random bytes, good for one connection and a few seconds. Before a ticket
matched, a node reads exactly ``len(HELLO) + TICKET_BYTES`` bytes from a connection, within
`HELLO_TIMEOUT_S`, and nothing else; so the port needs no authentication of its own.

Over gRPC the frames were copied by the node (into the reply and into gRPC's buffers) and
by the reader (out of gRPC's buffers, into one buffer): about 4 copies of every byte in
Python processes. Here the only copies are the kernel's, into the socket and out of it
into the reader's final buffer (docs/benchmarks-history.md, "Segment transfer port").

When the node's gRPC port uses TLS, so does this port, with the same certificates: the
reader connects with `client_tls(security)`, its gRPC credentials as an `ssl` context.

This module is the reader's side and the protocol's constants; the node's side is
`raftwal.services.segment_transfer`.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import tempfile
import time
from pathlib import Path

from rpc.credentials import ClientSecurity

#: What a reader sends first, before its ticket (the protocol's name and version).
HELLO = b"RWSEGXF1"
TICKET_BYTES = 32
#: The node's one-byte answer to a ticket.
ACCEPTED = b"\x00"
REFUSED = b"\x01"
#: How long a node waits for a connection's hello and ticket.
HELLO_TIMEOUT_S = 5.0
#: How long a reader waits for the connection to open; a firewalled port fails fast and
#: the reader falls back to the gRPC stream.
CONNECT_TIMEOUT_S = 3.0


class TransferError(Exception):
    """The transfer did not deliver the announced bytes; the message says what happened."""


def transfer_host(grpc_address: str) -> str:
    """The host part of a "host:port" gRPC address (brackets of an IPv6 literal removed)."""
    host = grpc_address.rpartition(":")[0] if ":" in grpc_address else grpc_address
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


@functools.lru_cache(maxsize=8)
def client_tls(security: ClientSecurity) -> ssl.SSLContext | None:
    """The `ssl` context for `security`'s TLS (its CA, or the system's, and its client
    certificate for mutual TLS), or None for plaintext. Python's `ssl` loads a certificate
    and key only from files: they are written to a private temporary directory (0700,
    files 0600), loaded, and removed at once."""
    if not security.tls:
        return None
    roots = security.root_certificates
    context = ssl.create_default_context(cadata=roots.decode("ascii") if roots else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if security.certificate_chain is not None and security.private_key is not None:
        with tempfile.TemporaryDirectory(prefix="raftwal-tls-") as directory:
            paths = []
            for name, pem in (
                ("chain.pem", security.certificate_chain),
                ("key.pem", security.private_key),
            ):
                path = Path(directory) / name
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(descriptor, "wb") as handle:
                    handle.write(pem)
                paths.append(path)
            context.load_cert_chain(paths[0], paths[1])
    return context


def receive(
    host: str,
    port: int,
    ticket: bytes,
    target: memoryview,
    timeout_s: float,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Fill `target` (writable, exactly the announced size) with the frames the node at
    `host`:`port` sends for `ticket`, over `tls` when given (the node's port speaks TLS
    when its gRPC port does); TransferError when it refuses, stops early, or the whole
    transfer takes longer than `timeout_s`."""
    if len(ticket) != TICKET_BYTES:
        raise TransferError(f"invalid ticket ({len(ticket)} bytes; expected {TICKET_BYTES})")
    if not 1 <= port <= 65535:
        raise TransferError(f"invalid transfer port ({port}; expected 1..65535)")
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((host, port), timeout=min(timeout_s, CONNECT_TIMEOUT_S))
    except OSError as error:
        raise TransferError(f"cannot connect to {host}:{port}: {error}") from None
    try:
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            if tls is not None:
                # The handshake runs here, within the socket's timeout; the wrapped socket
                # takes over the connection.
                sock = tls.wrap_socket(sock, server_hostname=host)
            sock.sendall(HELLO + ticket)
            status = sock.recv(1)
            if status != ACCEPTED:
                what = "closed the connection" if not status else "refused the ticket"
                raise TransferError(
                    f"{host}:{port} {what} (an expired or used ticket, or the node is stopping)"
                )
            position, size = 0, len(target)
            while position < size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransferError(
                        f"{host}:{port}: {position:,} of {size:,} bytes in {timeout_s:g} s"
                    )
                sock.settimeout(remaining)
                received = sock.recv_into(target[position:])
                if received == 0:
                    raise TransferError(
                        f"{host}:{port} closed the transfer after {position:,} of {size:,} bytes"
                    )
                position += received
        except TimeoutError:
            raise TransferError(f"{host}:{port}: no progress within {timeout_s:g} s") from None
        except OSError as error:
            raise TransferError(f"{host}:{port}: {error}") from None
    finally:
        sock.close()
