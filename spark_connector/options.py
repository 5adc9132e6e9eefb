"""The connector's options, parsed and validated once on the driver.

What lives here: `ReadOptions` (everything a read needs, small and picklable: it travels to
every executor inside the reader) and `parse_options`, which turns Spark's string options
into it or raises `ValueError` naming the option, what it got and what it expects.

Ranges are half-open like Kafka's starting/ending offsets: `fromTimeTick` and `fromLsn`
are inclusive, `toTimeTick` and `toLsn` exclusive.

Credentials: `token` or `tokenFile`, `tlsCaFile`, and `tlsCertFile` with `tlsKeyFile` for a
cluster that requires mutual TLS; without any of them, the driver's RAFTWAL_TOKEN...
environment (`rpc.credentials`). The files are read once, on the driver, and travel to the
executors inside `ReadOptions` (executors need no copy of them); a `ReadOptions` repr never
shows the token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from rpc.credentials import ClientSecurity, CredentialsError
from wal_segments.format import MSG_TYPE_CODES, MsgType

#: Spark's Kafka source splits partitions at this many records by default (none); we split
#: only large segments: one Python task costs ~40 ms of CPU, so keep partitions big.
DEFAULT_MAX_RECORDS_PER_PARTITION = 2_000_000
MIN_MAX_RECORDS_PER_PARTITION = 1

#: What a read shows by default: everything producers and broadcasts wrote, and the
#: transaction markers; never the WAL's own term-start and seal entries.
HIDDEN_MSG_TYPES = frozenset({int(MsgType.TERM_START), int(MsgType.SEAL)})

KNOWN_OPTIONS = {
    "endpoints",
    "pchannels",
    "vchannels",
    "fromtimetick",
    "totimetick",
    "fromlsn",
    "tolsn",
    "msgtypes",
    "asofrevision",
    "maxrecordsperpartition",
    "preferlocal",
    "localdatadirs",
    "token",
    "tokenfile",
    "tlscafile",
    "tlscertfile",
    "tlskeyfile",
    "timeoutseconds",
    "sealopensegments",
    "bulktransfer",
    "path",
    # readStream only (spark_connector.stream)
    "startingoffsets",
}


@dataclass(frozen=True)
class ReadOptions:
    endpoints: tuple[str, ...]
    pchannels: frozenset[str] | None = None
    vchannels: frozenset[str] | None = None
    from_time_tick: int | None = None
    to_time_tick: int | None = None
    #: per pchannel; the key "*" applies to every pchannel not named
    from_lsn: Mapping[str, int] = field(default_factory=dict)
    to_lsn: Mapping[str, int] = field(default_factory=dict)
    msg_types: frozenset[int] | None = None
    as_of_revision: int = 0
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    prefer_local: bool = False
    #: node id -> that node's data directory, as seen from the executors' hosts
    local_data_dirs: Mapping[str, str] = field(default_factory=dict)
    security: ClientSecurity = ClientSecurity()
    timeout_s: float = 30.0
    #: seal every open segment of the read's pchannels before reading the manifest, so the
    #: read sees everything acknowledged before it started (false: committed segments only)
    seal_open_segments: bool = True
    #: fetch segments over the nodes' segment transfer ports (false: the gRPC stream
    #: only, e.g. when a firewall closes those ports and every attempt would wait for
    #: the connect timeout before falling back)
    bulk_transfer: bool = True

    def lsn_bounds(self, pchannel: str) -> tuple[int | None, int | None]:
        low = self.from_lsn.get(pchannel, self.from_lsn.get("*"))
        high = self.to_lsn.get(pchannel, self.to_lsn.get("*"))
        return low, high


def _bad(name: str, got: str, expected: str) -> ValueError:
    return ValueError(f"raftwal option {name}: got {got!r}, expected {expected}")


def _names(name: str, value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    names = frozenset(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise _bad(name, value, "a comma-separated list of names")
    return names


def _int(name: str, value: str | None, low: int = 0, high: int = (1 << 63) - 1) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise _bad(name, value, "an integer") from None
    if not low <= number <= high:
        raise _bad(name, value, f"an integer in {low}..{high}")
    return number


def _per_pchannel(name: str, value: str | None) -> dict[str, int]:
    """`123` (every pchannel) or JSON `{"wal_0": 123, "wal_1": 7}`."""
    if value is None:
        return {}
    text = value.strip()
    if not text.startswith("{"):
        number = _int(name, text, 1)
        assert number is not None
        return {"*": number}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise _bad(name, value, 'an LSN or JSON like {"wal_0": 100}') from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
        for k, v in parsed.items()
    ):
        raise _bad(name, value, 'JSON object of pchannel -> LSN >= 1, like {"wal_0": 100}')
    return dict(parsed)


def _bool(name: str, value: str | None, default: bool = False) -> bool:
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise _bad(name, value, "true or false")


def _msg_types(value: str | None) -> frozenset[int] | None:
    names = _names("msgTypes", value)
    if names is None:
        return None
    unknown = sorted(n for n in names if n not in MSG_TYPE_CODES)
    if unknown:
        raise _bad("msgTypes", value or "", f"names among {', '.join(sorted(MSG_TYPE_CODES))}")
    return frozenset(MSG_TYPE_CODES[n] for n in names)


def _data_dirs(value: str | None) -> dict[str, str]:
    """`n1=/var/lib/raftwal/n1,n2=/data/n2`."""
    if value is None:
        return {}
    dirs: dict[str, str] = {}
    for part in value.split(","):
        node_id, sep, path = part.strip().partition("=")
        if not sep or not node_id or not path:
            raise _bad("localDataDirs", value, "node_id=/data/dir pairs separated by commas")
        dirs[node_id.strip()] = path.strip()
    return dirs


def _security(lowered: Mapping[str, str]) -> ClientSecurity:
    names = ("token", "tokenfile", "tlscafile", "tlscertfile", "tlskeyfile")
    try:
        if not any(lowered.get(name) for name in names):
            return ClientSecurity.from_env()
        return ClientSecurity.load(
            token=lowered.get("token") or None,
            token_file=lowered.get("tokenfile") or None,
            tls_ca_file=lowered.get("tlscafile") or None,
            tls_cert_file=lowered.get("tlscertfile") or None,
            tls_key_file=lowered.get("tlskeyfile") or None,
        )
    except CredentialsError as error:
        # The message names the file or variable, never the token.
        raise ValueError(f"raftwal credentials options: {error}") from None


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Validate Spark's options (keys are case-insensitive) into `ReadOptions`."""
    lowered = {key.lower(): value for key, value in options.items()}
    unknown = sorted(set(lowered) - KNOWN_OPTIONS)
    if unknown:
        raise _bad("name", ",".join(unknown), f"one of {', '.join(sorted(KNOWN_OPTIONS))}")
    endpoints_text = lowered.get("endpoints") or lowered.get("path")
    if not endpoints_text:
        raise _bad("endpoints", "", "host:port[,host:port...] of the cluster's gRPC ports")
    endpoints = tuple(e.strip() for e in endpoints_text.split(",") if e.strip())
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _bad("endpoints", endpoints_text, "host:port[,host:port...]")
    security = _security(lowered)
    for endpoint in endpoints:
        try:
            security.credentials(endpoint)
        except CredentialsError as error:
            raise _bad("endpoints", endpoint, f"a TLS or loopback endpoint ({error})") from None
    from_tick = _int("fromTimeTick", lowered.get("fromtimetick"))
    to_tick = _int("toTimeTick", lowered.get("totimetick"))
    if from_tick is not None and to_tick is not None and to_tick <= from_tick:
        raise _bad("toTimeTick", str(to_tick), f"> fromTimeTick ({from_tick})")
    timeout = lowered.get("timeoutseconds")
    try:
        timeout_s = float(timeout) if timeout is not None else 30.0
    except ValueError:
        raise _bad("timeoutSeconds", timeout or "", "a number of seconds") from None
    if not 0.1 <= timeout_s <= 3600:
        raise _bad("timeoutSeconds", str(timeout), "0.1..3600")
    max_records = _int(
        "maxRecordsPerPartition",
        lowered.get("maxrecordsperpartition"),
        MIN_MAX_RECORDS_PER_PARTITION,
    )
    return ReadOptions(
        endpoints=endpoints,
        pchannels=_names("pchannels", lowered.get("pchannels")),
        vchannels=_names("vchannels", lowered.get("vchannels")),
        from_time_tick=from_tick,
        to_time_tick=to_tick,
        from_lsn=_per_pchannel("fromLsn", lowered.get("fromlsn")),
        to_lsn=_per_pchannel("toLsn", lowered.get("tolsn")),
        msg_types=_msg_types(lowered.get("msgtypes")),
        as_of_revision=_int("asOfRevision", lowered.get("asofrevision")) or 0,
        max_records_per_partition=max_records or DEFAULT_MAX_RECORDS_PER_PARTITION,
        prefer_local=_bool("preferLocal", lowered.get("preferlocal")),
        local_data_dirs=_data_dirs(lowered.get("localdatadirs")),
        security=security,
        timeout_s=timeout_s,
        seal_open_segments=_bool("sealOpenSegments", lowered.get("sealopensegments"), default=True),
        bulk_transfer=_bool("bulkTransfer", lowered.get("bulktransfer"), default=True),
    )
