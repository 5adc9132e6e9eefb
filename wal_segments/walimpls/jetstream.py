"""The ``jetstream`` implementation: one JetStream stream per pchannel and epoch, on a NATS
server the user runs.

What lives here: `JetStreamBuilder` (registered as ``jetstream``; validates the config),
`JetStreamOpener` (one NATS connection per data worker) and `JetStreamWAL` (one stream).

The stream of pchannel P at epoch E (the alter that put P on ``jetstream``; 0 when it was
created on it) is ``<prefix>_<P with every character outside [A-Za-z0-9_-] as _><crc32 of
P>_<E>`` with one subject, file storage and the configured replicas. Each message is one
*record*:
- a data record is one write batch of the adaptor, its encoded frames as the payload and
  headers ``Rw-First``/``Rw-Last`` (its LSNs), ``Rw-Term`` and ``Rw-Prev-Term`` (the term of
  the entry before it); a batch larger than the connection's max payload goes as several
  messages (``Rw-Part: k/n``) and counts only when its last part is stored;
- a fence record has no payload and headers ``Rw-Fence`` (the new owner's term) and
  ``Rw-Last``/``Rw-Last-Term`` (the end of the log that owner recovered).

**Fencing** (docs/architecture.md, "The jetstream fencing argument"): every message is
published with ``Nats-Expected-Last-Sequence`` = the stream sequence of the message before
it, as this writer knows it. A new owner at term T reads the stream to its end, sequence S,
adopts it, and publishes its fence record expecting S. JetStream stores a message only if
the stream's last sequence is the expected one, one message at a time, so once the fence is
stored at S+1 every publish of an older owner (which expects at most S) is refused; and if
an older owner's publish landed first, the fence is refused instead, and the new owner reads
the new end and tries again.

**Acknowledgement**: a batch counts as durable once JetStream's PubAck for its (last)
message arrived: stored on the stream's replicas (file storage).

What must never happen here: reporting a batch durable that JetStream did not acknowledge,
or logging the credentials file's content; an import of `raft` or `raftwal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from wal_segments.walimpls.api import (
    ConfigError,
    Corrupt,
    DurableCallback,
    FencedByTerm,
    Record,
    Tail,
    Unavailable,
)
from wal_segments.walimpls.registry import register

logger = logging.getLogger(__name__)

NAME = "jetstream"
EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
#: every message of a writer names itself and the message it expects last in the stream:
#: a sequence check alone lets a pipelined publish through after a foreign message (see
#: `_publish`)
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
H_FIRST = "Rw-First"
H_LAST = "Rw-Last"
H_TERM = "Rw-Term"
H_PREV_TERM = "Rw-Prev-Term"
H_PART = "Rw-Part"
H_FENCE = "Rw-Fence"
H_LAST_TERM = "Rw-Last-Term"
#: JetStream's error codes for a failed Nats-Expected-Last-Sequence and
#: Nats-Expected-Last-Msg-Id check
WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_MSG_ID = 10070

DEFAULTS = {
    "url": "",
    "credentials": "",
    "replicas": "1",
    "stream_prefix": "RAFTWAL",
    "timeout_ms": "5000",
    "max_pending": "4096",
}
_URL_RE = re.compile(r"(nats|tls)://[A-Za-z0-9._\-\[\]:]+(:\d{1,5})?")
_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _int(config: Mapping[str, str], key: str, low: int, high: int) -> int:
    text = config[key]
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ConfigError(f"invalid jetstream {key} ({text[:32]!r}; expected {low}..{high})")
    return value


class JetStreamBuilder:
    """Config keys: ``url`` (required: nats:// or tls:// URLs, comma-separated),
    ``credentials`` (a NATS .creds file; its content is never logged), ``replicas`` (1..5,
    the stream's), ``stream_prefix``, ``timeout_ms`` (a publish without its ack for this
    long makes the backend unavailable), ``max_pending`` (messages in flight)."""

    name = NAME

    def validate(self, config: Mapping[str, str]) -> dict[str, str]:
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise ConfigError(
                f"unknown jetstream config key(s) {unknown[:4]} (expected {sorted(DEFAULTS)})"
            )
        merged = {**DEFAULTS, **{k: str(v) for k, v in config.items()}}
        urls = [u.strip() for u in merged["url"].split(",") if u.strip()]
        if not urls:
            raise ConfigError("jetstream needs url (got none; expected nats://HOST:PORT)")
        for url in urls:
            if not _URL_RE.fullmatch(url):
                raise ConfigError(
                    f"invalid jetstream url ({url[:64]!r}; expected nats://HOST:PORT or "
                    "tls://HOST:PORT, without credentials)"
                )
        merged["url"] = ",".join(urls)
        if merged["credentials"]:
            path = Path(merged["credentials"])
            if not path.is_file() or not os.access(path, os.R_OK):
                raise ConfigError(
                    f"jetstream credentials file {str(path)[:200]} is not a readable file"
                )
        if not _PREFIX_RE.fullmatch(merged["stream_prefix"]):
            raise ConfigError(
                f"invalid jetstream stream_prefix ({merged['stream_prefix'][:40]!r}; expected "
                "a letter then up to 31 of [A-Za-z0-9_-])"
            )
        _int(merged, "replicas", 1, 5)
        _int(merged, "timeout_ms", 100, 600_000)
        _int(merged, "max_pending", 1, 1_000_000)
        return merged

    def build(self, config: Mapping[str, str]) -> JetStreamOpener:
        return JetStreamOpener(self.validate(config))


def stream_name(prefix: str, pchannel: str, epoch: int) -> str:
    return f"{prefix}_{_UNSAFE.sub('_', pchannel)}_{zlib.crc32(pchannel.encode()):08x}_{epoch}"


class JetStreamOpener:
    """One NATS connection shared by the WALs of a data worker. A connection that breaks
    makes every WAL with something in flight fail Unavailable; the next `open` connects
    again."""

    name = NAME

    def __init__(self, config: dict[str, str]) -> None:
        self.config = config
        self.urls = config["url"].split(",")
        self.replicas = int(config["replicas"])
        self.prefix = config["stream_prefix"]
        self.timeout_s = int(config["timeout_ms"]) / 1000
        self.max_pending = int(config["max_pending"])
        self._nc: Any = None
        self._connecting = asyncio.Lock()
        self._wals: set[JetStreamWAL] = set()

    async def _error(self, error: Exception) -> None:
        logger.debug("jetstream connection: %r", error)

    async def _disconnected(self) -> None:
        for wal in list(self._wals):
            wal.broken(Unavailable("the NATS connection was lost"))

    async def connection(self) -> Any:
        async with self._connecting:
            if self._nc is not None and self._nc.is_connected:
                return self._nc
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._nc.close(), 2.0)
                self._nc = None
            options: dict[str, Any] = {
                "connect_timeout": max(1, int(self.timeout_s)),
                # A lost connection fails what is in flight (outcome unknown: the owner
                # stops and a new term recovers from the stream); the next open reconnects.
                "allow_reconnect": False,
                "max_reconnect_attempts": 1,
                "error_cb": self._error,
                "disconnected_cb": self._disconnected,
                "pending_size": 64 * 1024 * 1024,
                "name": "raftwal-wal",
            }
            if self.config["credentials"]:
                options["user_credentials"] = self.config["credentials"]
            try:
                self._nc = await asyncio.wait_for(
                    nats.connect(self.urls, **options), self.timeout_s + 1
                )
            except (TimeoutError, OSError, nats.errors.Error) as error:
                raise Unavailable(
                    f"cannot reach NATS at {self.config['url']} ({type(error).__name__})"
                ) from None
            return self._nc

    async def open(self, pchannel: str, epoch: int) -> JetStreamWAL:
        nc = await self.connection()
        wal = JetStreamWAL(self, nc, pchannel, stream_name(self.prefix, pchannel, epoch))
        await wal.ensure_stream()
        self._wals.add(wal)
        return wal

    def forget(self, wal: JetStreamWAL) -> None:
        self._wals.discard(wal)

    async def close(self) -> None:
        for wal in list(self._wals):
            await wal.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.close(), 2.0)
            self._nc = None


def _ack_error(data: bytes) -> tuple[int, str] | None:
    """(JetStream err_code, description) of a refused publish, None for a PubAck."""
    if not data:
        return 503, "no responders (no stream for the subject)"
    if b'"error"' not in data:
        return None
    try:
        error = json.loads(data)["error"]
        return int(error.get("err_code", 0)), str(error.get("description", ""))[:200]
    except (ValueError, KeyError, TypeError):
        return 0, data[:200].decode(errors="replace")


class JetStreamWAL:
    """One pchannel's stream at one epoch. `append` never blocks: a task publishes the
    queued records in order, each expecting the sequence before it, and reports them durable
    as their PubAcks arrive."""

    name = NAME
    replicated = False
    external = True

    def __init__(self, opener: JetStreamOpener, nc: Any, pchannel: str, stream: str) -> None:
        self._opener = opener
        self._nc = nc
        self._js = nc.jetstream(timeout=opener.timeout_s)
        self.pchannel = pchannel
        self.stream = stream
        self.subject = f"{opener.prefix}.wal.{stream}"
        self._callback: DurableCallback | None = None
        self._queue: deque[Record] = deque()
        self._wake = asyncio.Event()
        #: the stream sequence this writer's next message expects before it (set by fence)
        self._expected = -1
        #: the Nats-Msg-Id of this writer's last message (its fence, then each publish)
        self._last_id = ""
        #: (last stream sequence of a record, its last LSN, publish time), oldest first
        self._pending: deque[tuple[int, int, float]] = deque()
        self._inbox = f"_RWACK.{uuid.uuid4().hex}"
        self._subscription: Any = None
        self._task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._room = asyncio.Event()
        self._room.set()
        self.max_part = max(1024, int(getattr(nc, "max_payload", 1 << 20)) - 4096)

    # -- the stream ---------------------------------------------------------------------------

    async def ensure_stream(self) -> None:
        await self._connected()
        config = StreamConfig(
            name=self.stream,
            subjects=[self.subject],
            storage=StorageType.FILE,
            num_replicas=self._opener.replicas,
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.NEW,
            max_msg_size=-1,
            allow_direct=True,
        )
        try:
            await self._js.add_stream(config)
        except nats.js.errors.BadRequestError as error:
            # Exists already (with this config): fine; anything else is a config problem.
            if getattr(error, "err_code", 0) != 10058:
                raise ConfigError(
                    f"jetstream stream {self.stream}: {getattr(error, 'description', error)}"
                ) from None
        except (TimeoutError, nats.errors.Error) as error:
            raise Unavailable(f"jetstream stream {self.stream}: {type(error).__name__}") from None

    async def _connected(self) -> None:
        """Rebind to the opener's connection when ours is gone (a NATS server that was
        killed and came back): recovery's reads and the fence retry on a live one. The
        publisher never does: what it had in flight on a lost connection has an unknown
        outcome, so it fails and the owner stops."""
        if self._nc.is_closed or not self._nc.is_connected:
            self._nc = await self._opener.connection()
            self._js = self._nc.jetstream(timeout=self._opener.timeout_s)

    async def _call(self, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self._opener.timeout_s)
        except nats.js.errors.NotFoundError:
            return None
        except (TimeoutError, OSError, nats.errors.Error) as error:
            raise Unavailable(
                f"jetstream {self.stream}: {type(error).__name__} {str(error)[:120]}"
            ) from None

    async def last_sequence(self) -> int:
        await self._connected()
        info = await self._call(self._js.stream_info(self.stream))
        if info is None:
            raise Unavailable(f"jetstream stream {self.stream} does not exist")
        return int(info.state.last_seq)

    async def message(self, seq: int) -> tuple[dict[str, str], bytes] | None:
        raw = await self._call(self._js.get_msg(self.stream, seq=seq, direct=True))
        if raw is None:
            return None
        return dict(raw.headers or {}), raw.data or b""

    async def record_at(self, seq: int) -> tuple[Record, int] | None:
        """The record whose last message is at `seq` (None where `seq` holds a part of an
        unfinished record), and its first message's sequence."""
        found = await self.message(seq)
        if found is None:
            return None
        headers, data = found
        if H_FENCE in headers:
            return _fence_record(headers), seq
        part = headers.get(H_PART, "1/1")
        index, total = _part(part)
        if index != total:
            return None
        parts = [data]
        first_seq = seq
        for k in range(index - 1, 0, -1):
            first_seq -= 1
            earlier = await self.message(first_seq)
            if earlier is None or _part(earlier[0].get(H_PART, "1/1")) != (k, total):
                raise Corrupt(f"jetstream {self.stream}: record at {seq} lacks part {k}")
            parts.append(earlier[1])
        parts.reverse()
        return _data_record(headers, b"".join(parts)), first_seq

    async def tail(self) -> Tail:
        last = await self.last_sequence()
        seq = last
        while seq > 0:
            found = await self.record_at(seq)
            if found is not None:
                record = found[0]
                if record.fence:
                    return Tail(record.last_lsn, record.prev_term, record.term, records=last)
                return Tail(record.last_lsn, record.term, record.term, records=last)
            seq -= 1  # the unfinished record after the last whole one counts for nothing
        return Tail(0, 0, 0, records=last)

    async def scan(self, from_seq: int, to_seq: int) -> AsyncIterator[tuple[Record, int]]:
        """(record, its last sequence) for the whole records in from_seq..to_seq."""
        parts: list[bytes] = []
        for seq in range(from_seq, to_seq + 1):
            found = await self.message(seq)
            if found is None:
                parts = []
                continue
            headers, data = found
            if H_FENCE in headers:
                parts = []
                yield _fence_record(headers), seq
                continue
            index, total = _part(headers.get(H_PART, "1/1"))
            if index == 1:
                parts = []
            parts.append(data)
            if index == total and len(parts) == total:
                yield _data_record(headers, b"".join(parts)), seq
                parts = []

    async def fence(self, term: int, after: Tail) -> Tail:
        """Publish the fence record of `term` expecting `after.records` as the last
        sequence. Returns `after` once stored (this writer then expects its sequence), the
        stream's new tail when it grew meanwhile; raises FencedByTerm for a higher term."""
        if after.fenced_term > term:
            raise FencedByTerm(
                f"{self.stream} is fenced at term {after.fenced_term}", after.fenced_term
            )
        await self._connected()
        headers = {
            EXPECTED_LAST_SEQ: str(after.records),
            H_FENCE: str(term),
            H_LAST: str(after.last_lsn),
            H_LAST_TERM: str(after.last_term),
            MSG_ID: f"rw-fence-t{term}-s{after.records + 1}",
        }
        reply = await self._call(
            self._nc.request(self.subject, b"", timeout=self._opener.timeout_s, headers=headers)
        )
        refused = _ack_error(reply.data if reply is not None else b"")
        if refused is None:
            seq = int(json.loads(reply.data)["seq"])
            self._expected = seq
            self._last_id = headers[MSG_ID]
            return after
        code, text = refused
        if code == WRONG_LAST_SEQUENCE:
            grown = await self.tail()
            if grown.fenced_term > term:
                raise FencedByTerm(
                    f"{self.stream} is fenced at term {grown.fenced_term}", grown.fenced_term
                )
            return grown
        raise Unavailable(f"jetstream {self.stream}: fence refused ({code}: {text})")

    # -- the write path -----------------------------------------------------------------------

    def on_durable(self, callback: DurableCallback) -> None:
        self._callback = callback

    def append(self, record: Record) -> None:
        if self._failed is not None:
            return  # reported already: the owner stops
        assert self._expected >= 0, "append before fence"
        self._queue.append(record)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._publisher(), name=f"jetstream:{self.stream}")

    def broken(self, error: BaseException) -> None:
        if self._failed is not None:
            return
        self._failed = error
        logger.warning("%s: jetstream WAL stops: %s", self.pchannel, error)
        self._wake.set()
        self._room.set()
        if self._callback is not None:
            self._callback(error)

    async def _publisher(self) -> None:
        try:
            self._subscription = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)
            watchdog = asyncio.create_task(self._watch())
            try:
                while self._failed is None:
                    if not self._queue:
                        self._wake.clear()
                        await self._wake.wait()
                        continue
                    while len(self._pending) >= self._opener.max_pending and self._failed is None:
                        self._room.clear()
                        await self._room.wait()
                    if self._failed is not None:
                        break
                    await self._publish(self._queue.popleft())
            finally:
                watchdog.cancel()
        except asyncio.CancelledError:
            raise
        except (OSError, nats.errors.Error) as error:
            self.broken(
                Unavailable(f"jetstream {self.stream}: publish failed ({type(error).__name__})")
            )

    async def _publish(self, record: Record) -> None:
        frames = record.frames
        size = self.max_part
        total = max(1, -(-len(frames) // size))
        base = {
            H_FIRST: str(record.first_lsn),
            H_LAST: str(record.last_lsn),
            H_TERM: str(record.term),
            H_PREV_TERM: str(record.prev_term),
        }
        for index in range(total):
            # Publishes are pipelined, so the sequence check alone is not a fence: when a
            # new owner's fence lands between two of them, the first (expecting the
            # sequence before the fence) is refused but the next one expects exactly the
            # fence's sequence and would be stored after it. Naming the message expected
            # last refuses it and every later one: the fence's id is not this writer's.
            self._expected += 1
            message_id = f"rw-t{record.term}-s{self._expected}"
            headers = {
                **base,
                EXPECTED_LAST_SEQ: str(self._expected - 1),
                EXPECTED_LAST_MSG_ID: self._last_id,
                MSG_ID: message_id,
            }
            self._last_id = message_id
            if total > 1:
                headers[H_PART] = f"{index + 1}/{total}"
            seq = self._expected
            if index == total - 1:
                self._pending.append((seq, record.last_lsn, time.monotonic()))
            await self._nc.publish(
                self.subject,
                frames[index * size : (index + 1) * size],
                reply=f"{self._inbox}.{seq}",
                headers=headers,
            )

    async def _on_ack(self, message: Any) -> None:
        refused = _ack_error(message.data)
        if refused is not None:
            code, text = refused
            if code in (WRONG_LAST_SEQUENCE, WRONG_LAST_MSG_ID):
                self.broken(
                    FencedByTerm(f"jetstream {self.stream}: another writer appended ({text})", 0)
                )
            else:
                self.broken(
                    Unavailable(f"jetstream {self.stream}: publish refused ({code}: {text})")
                )
            return
        try:
            seq = int(message.subject.rsplit(".", 1)[1])
        except ValueError:
            return
        pending = self._pending
        durable = 0
        while pending and pending[0][0] <= seq:
            durable = pending.popleft()[1]
        if durable and self._callback is not None and self._failed is None:
            self._callback(durable)
        self._room.set()

    async def _watch(self) -> None:
        """A publish without its ack for `timeout_ms` makes the backend unavailable (a
        killed or paused server): its outcome is unknown, so the owner stops."""
        while self._failed is None:
            await asyncio.sleep(min(0.5, self._opener.timeout_s / 4))
            if self._pending and time.monotonic() - self._pending[0][2] > self._opener.timeout_s:
                self.broken(
                    Unavailable(
                        f"jetstream {self.stream}: no ack within {self._opener.timeout_s:g} s"
                    )
                )
            if self._nc.is_closed:
                self.broken(Unavailable(f"jetstream {self.stream}: NATS connection closed"))

    async def close(self) -> None:
        self._opener.forget(self)
        if self._failed is None:
            self._failed = Unavailable("closed")
            self._wake.set()
            self._room.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()


def _part(text: str) -> tuple[int, int]:
    try:
        index, total = (int(n) for n in text.split("/"))
    except ValueError:
        raise Corrupt(f"bad {H_PART} header {text[:20]!r}") from None
    return index, total


def _data_record(headers: Mapping[str, str], frames: bytes) -> Record:
    try:
        return Record(
            int(headers[H_FIRST]),
            int(headers[H_LAST]),
            int(headers[H_TERM]),
            int(headers[H_PREV_TERM]),
            frames,
        )
    except (KeyError, ValueError):
        raise Corrupt(f"a jetstream record without its headers ({sorted(headers)[:6]})") from None


def _fence_record(headers: Mapping[str, str]) -> Record:
    """A fence as a record without frames: term = the fencing term, prev_term = the term of
    the last entry then, first_lsn = last_lsn = that entry's LSN."""
    try:
        last = int(headers[H_LAST])
        return Record(last, last, int(headers[H_FENCE]), int(headers[H_LAST_TERM]), b"", fence=True)
    except (KeyError, ValueError):
        raise Corrupt(f"a jetstream fence without its headers ({sorted(headers)[:6]})") from None


register(JetStreamBuilder())
