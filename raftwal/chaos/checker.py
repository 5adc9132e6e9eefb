"""The chaos suite's checker: what the history and the healed cluster must satisfy.

Lives here: pure functions from a run's record (``History``, the consumers' deliveries,
the status samples, and ``FinalState``: what the healed cluster holds) to a list of
``Violation``. Only what the acknowledged history implies is asserted:

- produce: an ``ok`` message is in the final log exactly once, at the LSN it was acked
  with, on its vchannel; an ``unknown`` one at most once; a ``fail``ed one never; nothing
  else is there; one producer's acks on one pchannel follow its submission order;
- the log of each pchannel: LSNs contiguous from 1, terms never decrease, time ticks
  strictly increase;
- consumers were delivered committed entries only (each is in the final log at its LSN),
  in strictly increasing LSN order;
- locks: per key, an acquisition that started after another completed has a larger
  fencing token; no acquisition happened inside a hold whose release was acknowledged
  (the hold is known from the acquire's ack to the release's invocation); no client still
  believed it held a lock (its lease keeper alive, the lease not lost) when another
  client, which asked for the lock after that belief began, had acquired it;
- broadcasts: one broadcast id per idempotency key; an acknowledged broadcast is on every
  target vchannel exactly once (at the position it reported), never elsewhere; two
  broadcasts on one EXCLUSIVE key never overlap (the later one was created before the
  earlier one's last vchannel could have been acked);
- terms: in the sampled states, a pchannel's term never decreases with the revision, one
  (pchannel, term) has one owner, and a node's Raft term never decreases over time;
- subscriptions (issue 15): the exactly-once shard's final store applied every committed
  entry of its vchannel up to its checkpoint exactly once (each LSN once, per-key counters
  equal to the entries per key in the committed log); an observed position never went
  backwards, nor below a commit acknowledged before the observation, except across a Seek
  of that vchannel; no two members committed on one vchannel under one generation, and no
  member committed under an older generation after another member's newer one committed
  there; every pack's ticks follow the previous pack's, its messages are in (time tick,
  vchannel, lsn) order within (begin, end], and it holds exactly the committed entries of
  its vchannels in that range;
- after healing: every replica at one revision and state digest, every pchannel's WAL
  replicas durable up to its owner's committed LSN; committed segments
  contiguous, each replica's file with the manifest's digest and range, and the same
  entries the consumers read; Spark read exactly the entries of the committed segments.

Must never: talk to the cluster, read a clock, or report a violation that an allowed
outcome (an ``unknown`` operation, a stale read) could explain.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from raftwal.chaos.workload import FAIL, OK, Delivery, History, Op, StatusSample

# Message types the WAL writes itself (never produced by a client).
CONTROL_MSG_TYPES = frozenset({"term_start", "seal"})
# Details listed per violation kind before the rest is only counted.
MAX_DETAILS_PER_KIND = 20


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class LogEntry:
    lsn: int
    term: int
    time_tick: int
    vchannel: str
    msg_type: str
    #: the payload's workload key (see raftwal.chaos.workload.payload_key)
    key: str
    broadcast_id: int
    #: sha1 of the payload, hex
    digest: str
    #: written by the WAL itself (a control flag: term start, seal, an idle owner's time tick)
    control: bool = False


@dataclass(frozen=True)
class SegmentInfo:
    pchannel: str
    first_lsn: int
    last_lsn: int
    count: int
    digest: int
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class SegmentFileCheck:
    """One replica's copy of one committed segment, as read from its data directory."""

    pchannel: str
    first_lsn: int
    node_id: str
    error: str = ""
    digest: int = 0
    last_lsn: int = 0
    count: int = 0
    #: (lsn, term, time_tick, sha1 of payload) per entry, when this copy was read in full
    entries: tuple[tuple[int, int, int, str], ...] | None = None


@dataclass
class FinalState:
    logs: dict[str, list[LogEntry]] = field(default_factory=dict)
    #: pchannel -> why its final read is incomplete
    log_errors: dict[str, str] = field(default_factory=dict)
    segments: list[SegmentInfo] = field(default_factory=list)
    segment_files: list[SegmentFileCheck] = field(default_factory=list)
    converged: bool = True
    convergence_detail: str = ""
    #: owners' replicas that did not catch up with the committed LSN after healing
    replica_detail: str = ""
    #: (pchannel, lsn, sha1 of payload) of every row Spark read; None: not checked
    spark_rows: set[tuple[str, int, str]] | None = None
    spark_error: str = ""
    #: the SparkSession could not start (not a finding about the cluster)
    spark_unavailable: str = ""
    recovery_error: str = ""
    #: pchannel -> the first LSN WAL retention kept, frozen before the final reads (absent:
    #: 1, nothing deleted). Acknowledged entries below it may be gone; none above it.
    floors: dict[str, int] = field(default_factory=dict)
    #: the voter set did not settle, or a node runs in another role than it gives it
    membership_error: str = ""
    #: ClusterStatus warnings once converged (reported, not judged)
    warnings: list[str] = field(default_factory=list)
    #: pchannel -> (owner, replica set) once converged, and each non-owner member's
    #: committed log read from it (or why it could not be read)
    replica_sets: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    replica_logs: dict[str, dict[str, list[LogEntry] | str]] = field(default_factory=dict)


class _Violations:
    def __init__(self) -> None:
        self.items: list[Violation] = []
        self._per_kind: dict[str, int] = {}

    def add(self, kind: str, detail: str) -> None:
        count = self._per_kind.get(kind, 0) + 1
        self._per_kind[kind] = count
        if count <= MAX_DETAILS_PER_KIND:
            self.items.append(Violation(kind, detail))

    def result(self) -> list[Violation]:
        extra = [
            Violation(kind, f"... and {count - MAX_DETAILS_PER_KIND} more of this kind")
            for kind, count in sorted(self._per_kind.items())
            if count > MAX_DETAILS_PER_KIND
        ]
        return self.items + extra


def _t(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds:.3f}s"


def _ops(history: History, *kinds: str) -> list[Op]:
    return [op for op in history.ops if op.kind in kinds]


# ---------------------------------------------------------------------------------------
# Produce and the logs
# ---------------------------------------------------------------------------------------


def check_logs(
    logs: Mapping[str, Sequence[LogEntry]], out: _Violations, floors: Mapping[str, int]
) -> None:
    for pchannel, entries in sorted(logs.items()):
        if not entries:
            continue
        floor = floors.get(pchannel, 1)
        if entries[0].lsn != floor:
            out.add(
                "lsn-order",
                f"{pchannel}: the log starts at lsn {entries[0].lsn}, not {floor} (the first "
                "lsn retention kept)",
            )
        for before, after in zip(entries, entries[1:], strict=False):
            if after.lsn != before.lsn + 1:
                out.add(
                    "lsn-order",
                    f"{pchannel}: lsn {after.lsn} follows {before.lsn} (expected {before.lsn + 1})",
                )
            if after.term < before.term:
                out.add(
                    "term-regression",
                    f"{pchannel}: lsn {after.lsn} has term {after.term} after term "
                    f"{before.term} at lsn {before.lsn}",
                )
            if after.time_tick <= before.time_tick:
                out.add(
                    "time-tick-order",
                    f"{pchannel}: lsn {after.lsn} has time tick {after.time_tick}, not above "
                    f"{before.time_tick} at lsn {before.lsn}",
                )


def check_produce(
    history: History,
    logs: Mapping[str, Sequence[LogEntry]],
    vchannel_pchannel: Mapping[str, str],
    out: _Violations,
    floors: Mapping[str, int],
) -> None:
    """`logs` holds the complete final logs; messages of the other pchannels are skipped.
    An acknowledged message below its pchannel's retention floor may be gone; every
    acknowledged message at or above it must be there."""
    produced = {
        op.value["key"]: op
        for op in _ops(history, "produce")
        if vchannel_pchannel[op.value["vchannel"]] in logs
    }
    found: dict[str, list[tuple[str, LogEntry]]] = {}
    for pchannel, entries in logs.items():
        for entry in entries:
            if entry.control or entry.msg_type in CONTROL_MSG_TYPES or entry.broadcast_id:
                continue
            if entry.key not in produced:
                out.add(
                    "unexpected-entry",
                    f"{pchannel} lsn {entry.lsn}: {entry.key!r} was never produced",
                )
                continue
            found.setdefault(entry.key, []).append((pchannel, entry))
    for key, op in produced.items():
        places = found.get(key, [])
        where = ", ".join(f"{p}@{e.lsn}" for p, e in places)
        if len(places) > 1:
            out.add("duplicate", f"{key} ({op.outcome}, op {op.index}) is in the log at {where}")
        if op.outcome == OK:
            if not places and int(op.result["lsn"]) < floors.get(op.result["pchannel"], 1):
                continue  # deleted by retention
            if not places:
                out.add(
                    "lost",
                    f"{key} acknowledged at {op.result['pchannel']}@{op.result['lsn']} "
                    f"(op {op.index}, acked {_t(op.complete_s)}) is not in the log",
                )
                continue
            pchannel, entry = places[0]
            expected = (op.result["pchannel"], op.result["lsn"], op.value["vchannel"])
            if (pchannel, entry.lsn, entry.vchannel) != expected:
                out.add(
                    "ack-mismatch",
                    f"{key} acknowledged at {expected[0]}@{expected[1]} on {expected[2]}, "
                    f"found at {pchannel}@{entry.lsn} on {entry.vchannel}",
                )
        elif op.outcome == FAIL and places:
            out.add("failed-write-visible", f"{key} failed ({op.error}) but is at {where}")
    # One producer's acknowledged messages on one pchannel follow its submission order.
    by_lane: dict[tuple[str, str], list[Op]] = {}
    for op in produced.values():
        if op.outcome == OK:
            by_lane.setdefault((op.process, op.result["pchannel"]), []).append(op)
    for (process, pchannel), ops in sorted(by_lane.items()):
        ops.sort(key=lambda o: o.index)
        for before, after in zip(ops, ops[1:], strict=False):
            if after.result["lsn"] <= before.result["lsn"]:
                out.add(
                    "lsn-order",
                    f"{process} on {pchannel}: {after.value['key']} submitted after "
                    f"{before.value['key']} but acked at lsn {after.result['lsn']} <= "
                    f"{before.result['lsn']}",
                )


def check_consumers(
    deliveries: Mapping[str, Sequence[Delivery]],
    vchannel_pchannel: Mapping[str, str],
    logs: Mapping[str, Sequence[LogEntry]],
    complete_logs: set[str],
    out: _Violations,
    floors: Mapping[str, int],
) -> None:
    for vchannel, delivered in sorted(deliveries.items()):
        pchannel = vchannel_pchannel[vchannel]
        floor = floors.get(pchannel, 1)
        by_lsn = {e.lsn: e for e in logs.get(pchannel, ())}
        last = 0
        for item in delivered:
            if item.lsn <= last:
                out.add(
                    "consumer-order",
                    f"consumer of {vchannel} was delivered lsn {item.lsn} after lsn {last}",
                )
            last = max(last, item.lsn)
            entry = by_lsn.get(item.lsn)
            if entry is None:
                if pchannel in complete_logs and item.lsn >= floor:
                    out.add(
                        "dirty-read",
                        f"consumer of {vchannel} was delivered {item.key!r} at lsn {item.lsn}, "
                        "which is not in the final log",
                    )
                continue
            if (entry.key, entry.vchannel) != (item.key, vchannel):
                out.add(
                    "dirty-read",
                    f"consumer of {vchannel} was delivered {item.key!r} at lsn {item.lsn}; the "
                    f"final log has {entry.key!r} on {entry.vchannel} there",
                )


# ---------------------------------------------------------------------------------------
# Locks
# ---------------------------------------------------------------------------------------


def check_locks(history: History, out: _Violations) -> None:
    locks = [op for op in _ops(history, "lock") if op.outcome == OK]
    by_index = {op.index: op for op in _ops(history, "lock")}
    by_key: dict[str, list[Op]] = {}
    for op in locks:
        by_key.setdefault(op.value["key"], []).append(op)
    for key, ops in sorted(by_key.items()):
        # Fencing tokens: distinct per acquisition, increasing along real-time order.
        tokens: dict[int, Op] = {}
        for op in ops:
            other = tokens.get(op.result["token"])
            if other is not None and other.value["lease"] != op.value["lease"]:
                out.add(
                    "lock-token",
                    f"{key}: ops {other.index} (lease {other.value['lease']}) and {op.index} "
                    f"(lease {op.value['lease']}) both got fencing token {op.result['token']}",
                )
            tokens[op.result["token"]] = op
        by_complete = sorted(ops, key=lambda o: o.complete_s)
        best: Op | None = None
        cursor = 0
        for op in sorted(ops, key=lambda o: o.invoke_s):
            while cursor < len(by_complete) and by_complete[cursor].complete_s < op.invoke_s:
                candidate = by_complete[cursor]
                if best is None or candidate.result["token"] > best.result["token"]:
                    best = candidate
                cursor += 1
            if best is not None and best.result["token"] >= op.result["token"]:
                out.add(
                    "lock-token",
                    f"{key}: op {op.index} ({op.process}, invoked {_t(op.invoke_s)}) got token "
                    f"{op.result['token']}, not above token {best.result['token']} of op "
                    f"{best.index} ({best.process}) acknowledged at {_t(best.complete_s)}",
                )
        # Holds with an acknowledged release contain no other acquisition.
        invokes = sorted(ops, key=lambda o: o.invoke_s)
        invoke_times = [o.invoke_s for o in invokes]
        for unlock in _ops(history, "unlock"):
            lock = by_index.get(unlock.value["lock"])
            if unlock.outcome != OK or lock is None or lock.outcome != OK:
                continue
            if lock.value["key"] != key:
                continue
            start, end = lock.complete_s, unlock.invoke_s
            low = bisect.bisect_right(invoke_times, start)
            high = bisect.bisect_left(invoke_times, end)
            for other in invokes[low:high]:
                if other is not lock and other.complete_s < end:
                    out.add(
                        "lock-overlap",
                        f"{key}: op {other.index} ({other.process}, lease "
                        f"{other.value['lease']}, token {other.result['token']}) acquired during "
                        f"[{_t(start)}, {_t(end)}], the hold of op {lock.index} ({lock.process}, "
                        f"lease {lock.value['lease']}, token {lock.result['token']}) released "
                        f"by op {unlock.index}",
                    )


def check_lock_beliefs(history: History, out: _Violations) -> None:
    """No zombie holder: a ``hold`` is the span in which a client believed it held a lock
    (from the lock's acknowledgement until it released it or its lease keeper stopped
    vouching for the lease). Another lease's acquisition of that key that was invoked
    after the hold began and acknowledged before it ended happened inside that belief.

    Only such acquisitions count: one invoked earlier may have taken the key before this
    hold's own acquisition (the mutual-exclusion checks above cover that case)."""
    acquired: dict[str, list[Op]] = {}
    for op in _ops(history, "lock"):
        if op.outcome == OK:
            acquired.setdefault(op.value["key"], []).append(op)
    for ops in acquired.values():
        ops.sort(key=lambda o: o.invoke_s)
    invoke_times = {key: [o.invoke_s for o in ops] for key, ops in acquired.items()}
    for hold in _ops(history, "hold"):
        if hold.outcome != OK:
            continue
        key = hold.value["key"]
        ops = acquired.get(key, [])
        start, end = hold.invoke_s, hold.complete_s
        low = bisect.bisect_left(invoke_times.get(key, []), start)
        for other in ops[low:]:
            if other.invoke_s >= end:
                break
            if other.value["lease"] != hold.value["lease"] and other.complete_s < end:
                out.add(
                    "zombie-holder",
                    f"{key}: {hold.process} (lease {hold.value['lease']}, lock op "
                    f"{hold.value['lock']}) still believed it held the lock until {_t(end)} "
                    f"({hold.result.get('reason', '?')}), but op {other.index} "
                    f"({other.process}, lease {other.value['lease']}, token "
                    f"{other.result['token']}) acquired it by {_t(other.complete_s)}",
                )


# ---------------------------------------------------------------------------------------
# Broadcasts
# ---------------------------------------------------------------------------------------


@dataclass
class _Broadcast:
    idempotency_key: str
    key: str
    message: str
    vchannels: list[str]
    ids: set[int] = field(default_factory=set)
    #: vchannel -> lsn reported by the coordinator (appended)
    appended: dict[str, int] = field(default_factory=dict)
    created_by_s: float = math.inf
    #: vchannel -> first time an ack for it was sent
    first_ack_s: dict[str, float] = field(default_factory=dict)

    @property
    def released_after_s(self) -> float:
        """No earlier than this could the broadcast's keys have been released."""
        if any(v not in self.first_ack_s for v in self.vchannels):
            return math.inf
        return max(self.first_ack_s.values())


def _broadcasts(history: History) -> dict[str, _Broadcast]:
    jobs: dict[str, _Broadcast] = {}
    for op in _ops(history, "broadcast", "broadcast_poll", "ack"):
        idem = op.value["idempotency_key"]
        if op.kind != "ack":
            job = jobs.setdefault(
                idem, _Broadcast(idem, op.value["key"], op.value["message"], op.value["vchannels"])
            )
            if op.outcome == OK:
                job.ids.add(op.result["broadcast_id"])
                job.created_by_s = min(job.created_by_s, op.complete_s)
                for vchannel, lsn in op.result["appended"].items():
                    job.appended.setdefault(vchannel, lsn)
        else:
            job = jobs[idem]
            vchannel = op.value["vchannel"]
            job.first_ack_s[vchannel] = min(job.first_ack_s.get(vchannel, math.inf), op.invoke_s)
    return jobs


def check_broadcasts(
    history: History,
    logs: Mapping[str, Sequence[LogEntry]],
    complete_logs: set[str],
    vchannel_pchannel: Mapping[str, str],
    out: _Violations,
    floors: Mapping[str, int] | None = None,
) -> None:
    """Broadcasts against the final logs; below a retention floor an appended broadcast
    may be gone (retention keeps unacknowledged ones only)."""
    floors = floors or {}
    jobs = _broadcasts(history)
    by_message = {job.message: job for job in jobs.values()}
    seen: dict[str, list[tuple[str, LogEntry]]] = {}
    for pchannel, entries in logs.items():
        for entry in entries:
            if entry.broadcast_id:
                if entry.key not in by_message:
                    out.add(
                        "unexpected-entry",
                        f"{pchannel} lsn {entry.lsn}: broadcast {entry.broadcast_id} with "
                        f"{entry.key!r} was never requested",
                    )
                    continue
                seen.setdefault(entry.key, []).append((pchannel, entry))
    for job in jobs.values():
        if len(job.ids) > 1:
            out.add(
                "broadcast-duplicate",
                f"idempotency key {job.idempotency_key} answered broadcast ids {sorted(job.ids)}",
            )
        places = seen.get(job.message, [])
        per_vchannel: dict[str, list[tuple[str, LogEntry]]] = {}
        for pchannel, entry in places:
            per_vchannel.setdefault(entry.vchannel, []).append((pchannel, entry))
            if entry.vchannel not in job.vchannels:
                out.add(
                    "broadcast-misdelivered",
                    f"{job.message} (targets {job.vchannels}) is on {entry.vchannel} at "
                    f"{pchannel}@{entry.lsn}",
                )
            if job.ids and entry.broadcast_id not in job.ids:
                out.add(
                    "broadcast-duplicate",
                    f"{job.message} is at {pchannel}@{entry.lsn} as broadcast "
                    f"{entry.broadcast_id}, answered as {sorted(job.ids)}",
                )
        for vchannel, found in per_vchannel.items():
            if len(found) > 1:
                out.add(
                    "broadcast-duplicate",
                    f"{job.message} is on {vchannel} {len(found)} times: "
                    + ", ".join(f"{p}@{e.lsn}" for p, e in found),
                )
        if not job.ids:
            continue
        for vchannel in job.vchannels:
            found = per_vchannel.get(vchannel, [])
            reported = job.appended.get(vchannel)
            floor = floors.get(vchannel_pchannel[vchannel], 1)
            deleted = floor > 1 and (reported is None or reported < floor)
            if not found and deleted:
                continue
            if not found:
                if vchannel_pchannel[vchannel] in complete_logs:
                    out.add(
                        "broadcast-lost",
                        f"{job.message} (broadcast {sorted(job.ids)}, acknowledged at "
                        f"{_t(job.created_by_s)}) never reached {vchannel}"
                        + (f" (reported appended at lsn {reported})" if reported else ""),
                    )
            elif reported is not None and found[0][1].lsn != reported:
                out.add(
                    "broadcast-lost",
                    f"{job.message} reported appended to {vchannel} at lsn {reported}, found at "
                    f"lsn {found[0][1].lsn}",
                )
    # EXCLUSIVE resource keys: a broadcast is created only after the previous holder of its
    # key could have been released (all its vchannels acked).
    by_key: dict[str, list[_Broadcast]] = {}
    for job in jobs.values():
        if len(job.ids) == 1:
            by_key.setdefault(job.key, []).append(job)
    for key, holders in sorted(by_key.items()):
        holders.sort(key=lambda j: min(j.ids))
        released = -math.inf
        previous: _Broadcast | None = None
        for job in holders:
            if previous is not None and job.created_by_s < released:
                out.add(
                    "resource-key-overlap",
                    f"{key}: broadcast {min(job.ids)} ({job.message}) was created by "
                    f"{_t(job.created_by_s)}, while broadcast {min(previous.ids)} "
                    f"({previous.message}) held the key until at least {_t(released)}",
                )
            if job.released_after_s > released:
                released, previous = job.released_after_s, job


# ---------------------------------------------------------------------------------------
# Terms
# ---------------------------------------------------------------------------------------


def check_terms(samples: Sequence[StatusSample], out: _Violations) -> None:
    by_revision = sorted(samples, key=lambda s: (s.revision, s.at_s))
    highest: dict[str, tuple[int, int]] = {}  # pchannel -> (term, revision seen)
    at_revision: dict[tuple[str, int], tuple[int, str]] = {}
    owners: dict[tuple[str, int], set[str]] = {}
    for sample in by_revision:
        for pchannel, (term, owner, _state) in sample.pchannels.items():
            same = at_revision.setdefault((pchannel, sample.revision), (term, sample.endpoint))
            if same[0] != term:
                out.add(
                    "divergence",
                    f"{pchannel} at revision {sample.revision}: term {same[0]} on {same[1]}, "
                    f"term {term} on {sample.endpoint}",
                )
            top = highest.get(pchannel)
            if top is not None and term < top[0] and top[1] < sample.revision:
                out.add(
                    "term-regression",
                    f"{pchannel}: term {term} at revision {sample.revision} ({sample.endpoint}) "
                    f"after term {top[0]} at revision {top[1]}",
                )
            if top is None or term > top[0]:
                highest[pchannel] = (term, sample.revision)
            if term > 0 and owner:
                owners.setdefault((pchannel, term), set()).add(owner)
    for (pchannel, term), seen in sorted(owners.items()):
        if len(seen) > 1:
            out.add("term-owner", f"{pchannel} term {term} had owners {sorted(seen)}")
    raft_terms: dict[str, tuple[int, float]] = {}
    for sample in samples:
        for node_id, term in sample.raft_terms.items():
            last = raft_terms.get(node_id)
            if last is not None and term < last[0]:
                out.add(
                    "raft-term-regression",
                    f"{node_id}: Raft term {term} at {_t(sample.at_s)} after term {last[0]} at "
                    f"{_t(last[1])}",
                )
            if last is None or term >= last[0]:
                raft_terms[node_id] = (term, sample.at_s)


# ---------------------------------------------------------------------------------------
# The healed cluster
# ---------------------------------------------------------------------------------------


def check_segments(final: FinalState, out: _Violations) -> None:
    by_pchannel: dict[str, list[SegmentInfo]] = {}
    for segment in final.segments:
        by_pchannel.setdefault(segment.pchannel, []).append(segment)
    for pchannel, segments in sorted(by_pchannel.items()):
        segments.sort(key=lambda s: s.first_lsn)
        expected_first = final.floors.get(pchannel, 1)
        log = {e.lsn: e for e in final.logs.get(pchannel, ())}
        complete = pchannel not in final.log_errors
        for segment in segments:
            name = f"{pchannel} segment {segment.first_lsn}..{segment.last_lsn}"
            if segment.first_lsn != expected_first:
                out.add("segment-gap", f"{name} (expected it to start at {expected_first})")
            expected_first = segment.last_lsn + 1
            if segment.count != segment.last_lsn - segment.first_lsn + 1:
                out.add("segment-gap", f"{name} counts {segment.count} entries")
            if complete and segment.last_lsn not in log:
                out.add("segment-beyond-log", f"{name} ends beyond the committed log")
    files: dict[tuple[str, int], list[SegmentFileCheck]] = {}
    for check in final.segment_files:
        files.setdefault((check.pchannel, check.first_lsn), []).append(check)
    for segment in final.segments:
        name = f"{segment.pchannel} segment {segment.first_lsn}..{segment.last_lsn}"
        copies = files.get((segment.pchannel, segment.first_lsn), [])
        if not segment.replicas:
            out.add("segment-replica", f"{name} lists no replica")
        for copy in copies:
            if copy.error:
                out.add("segment-replica", f"{name} on {copy.node_id}: {copy.error}")
                continue
            declared = (segment.digest, segment.last_lsn, segment.count)
            if (copy.digest, copy.last_lsn, copy.count) != declared:
                out.add(
                    "segment-divergence",
                    f"{name} on {copy.node_id}: digest {copy.digest:#010x}, last lsn "
                    f"{copy.last_lsn}, {copy.count} entries; manifest says "
                    f"{segment.digest:#010x}, {segment.last_lsn}, {segment.count}",
                )
            if copy.entries is not None and segment.pchannel not in final.log_errors:
                log = {e.lsn: e for e in final.logs.get(segment.pchannel, ())}
                for lsn, term, tick, digest in copy.entries:
                    entry = log.get(lsn)
                    if entry is None or (entry.term, entry.time_tick, entry.digest) != (
                        term,
                        tick,
                        digest,
                    ):
                        out.add(
                            "segment-divergence",
                            f"{name} on {copy.node_id}: lsn {lsn} (term {term}) differs from "
                            "what consumers read",
                        )
                        break


def check_spark(final: FinalState, out: _Violations) -> None:
    if final.spark_error:
        out.add("spark", final.spark_error)
        return
    if final.spark_rows is None:
        return
    expected: set[tuple[str, int, str]] = set()
    for segment in final.segments:
        log = final.logs.get(segment.pchannel, ())
        for entry in log:
            if (
                segment.first_lsn <= entry.lsn <= segment.last_lsn
                and not entry.control
                and entry.msg_type not in CONTROL_MSG_TYPES
            ):
                expected.add((segment.pchannel, entry.lsn, entry.digest))
    missing = sorted(expected - final.spark_rows)
    extra = sorted(final.spark_rows - expected)
    for pchannel, lsn, _ in missing[:MAX_DETAILS_PER_KIND]:
        out.add("spark-missing", f"{pchannel}@{lsn} is committed but Spark did not read it")
    for pchannel, lsn, _ in extra[:MAX_DETAILS_PER_KIND]:
        out.add("spark-extra", f"Spark read {pchannel}@{lsn}, which no committed segment holds")


def _data_entries(
    logs: Mapping[str, Sequence[LogEntry]], vchannel_pchannel: Mapping[str, str], vchannel: str
) -> list[LogEntry] | None:
    """The entries a consumer of `vchannel` is delivered (None: its log is incomplete)."""
    entries = logs.get(vchannel_pchannel.get(vchannel, ""))
    if entries is None:
        return None
    return [
        e
        for e in entries
        if e.vchannel == vchannel and not e.control and e.msg_type not in CONTROL_MSG_TYPES
    ]


def check_exactly_once(
    history: History,
    logs: Mapping[str, Sequence[LogEntry]],
    vchannel_pchannel: Mapping[str, str],
    out: _Violations,
    floors: Mapping[str, int],
) -> None:
    """The shard's final store against the committed log of its vchannel (from the
    retention floor on: the per-key counters only when nothing was deleted)."""
    for op in _ops(history, "shard_final"):
        if op.outcome != OK:
            out.add("shard-final", f"the shard's final store was not read: {op.error}")
            continue
        vchannel = op.value["vchannel"]
        entries = _data_entries(logs, vchannel_pchannel, vchannel)
        if entries is None:
            continue
        source_lsn = int(op.result["source_lsn"])
        floor = floors.get(vchannel_pchannel[vchannel], 1)
        expected = [e for e in entries if e.lsn <= source_lsn]
        if source_lsn >= floor and source_lsn not in {e.lsn for e in entries}:
            out.add(
                "shard-checkpoint",
                f"{vchannel}: checkpoint lsn {source_lsn} is no committed entry of it",
            )
        applied = Counter(int(lsn) for lsn in op.result["applied"] if int(lsn) >= floor)
        wanted = Counter(e.lsn for e in expected)
        for lsn in sorted(set(applied) | set(wanted)):
            if applied[lsn] != wanted[lsn]:
                out.add(
                    "exactly-once",
                    f"{vchannel} lsn {lsn}: applied {applied[lsn]} times, expected "
                    f"{wanted[lsn]} (checkpoint {source_lsn})",
                )
        if floor > 1:
            continue  # the counters count messages retention deleted since
        counters = {str(k): int(n) for k, n in op.result["counters"].items()}
        per_key = Counter(e.key.split(":", 1)[0] for e in expected)
        for key in sorted(set(counters) | set(per_key)):
            if counters.get(key, 0) != per_key[key]:
                out.add(
                    "shard-counter",
                    f"{vchannel} key {key!r}: counter {counters.get(key, 0)}, committed "
                    f"messages {per_key[key]} up to lsn {source_lsn}",
                )


def _seek_between(seeks: Sequence[Op], vchannel: str, after_s: float, before_s: float) -> bool:
    """A Seek of `vchannel` (or of all) that may have taken effect in (after_s, before_s)."""
    return any(
        s.value.get("vchannel", "") in ("", vchannel)
        and s.invoke_s < before_s
        and s.complete_s > after_s
        for s in seeks
    )


def check_positions(history: History, out: _Violations) -> None:
    """Observed positions never go back, nor below an acknowledged commit, except across
    a Seek."""
    observed: dict[str, list[Op]] = {}
    for op in _ops(history, "sub_observe"):
        if op.outcome == OK:
            observed.setdefault(op.value["subscription"], []).append(op)
    seeks: dict[str, list[Op]] = {}
    for op in _ops(history, "sub_seek"):
        if op.outcome != FAIL:
            seeks.setdefault(op.value["subscription"], []).append(op)
    commits: dict[str, list[Op]] = {}
    for op in _ops(history, "sub_commit"):
        if op.outcome == OK:
            commits.setdefault(op.value["subscription"], []).append(op)
    for subscription, samples in sorted(observed.items()):
        samples = sorted(samples, key=lambda o: o.invoke_s)
        its_seeks = seeks.get(subscription, [])
        last: dict[str, Op] = {}
        for sample in samples:
            for vchannel, lsn in sorted(sample.result["positions"].items()):
                before = last.get(vchannel)
                if (
                    before is not None
                    and lsn < before.result["positions"][vchannel]
                    and not _seek_between(its_seeks, vchannel, before.invoke_s, sample.complete_s)
                ):
                    out.add(
                        "position-backwards",
                        f"{subscription}/{vchannel}: {before.result['positions'][vchannel]} at "
                        f"{_t(before.complete_s)}, then {lsn} at {_t(sample.complete_s)} "
                        "without a Seek",
                    )
                last[vchannel] = sample
        for commit in commits.get(subscription, []):
            vchannel, lsn = commit.value["vchannel"], int(commit.value["lsn"])
            for sample in samples:
                if sample.invoke_s <= commit.complete_s:
                    continue
                seen = sample.result["positions"].get(vchannel, 0)
                if seen < lsn and not _seek_between(
                    its_seeks, vchannel, commit.invoke_s, sample.complete_s
                ):
                    out.add(
                        "position-lost",
                        f"{subscription}/{vchannel}: commit of lsn {lsn} acknowledged at "
                        f"{_t(commit.complete_s)}, position {seen} observed at "
                        f"{_t(sample.invoke_s)} without a Seek",
                    )
                break


def check_member_generations(history: History, out: _Violations) -> None:
    """Per vchannel: acknowledged commits of different members never share a generation,
    and none under an older generation began after a newer one's commit completed."""
    by_vchannel: dict[tuple[str, str], list[Op]] = {}
    for op in _ops(history, "sub_commit"):
        if op.outcome == OK and op.value.get("member"):
            key = (op.value["subscription"], op.value["vchannel"])
            by_vchannel.setdefault(key, []).append(op)
    for (subscription, vchannel), commits in sorted(by_vchannel.items()):
        holders: dict[int, str] = {}
        for op in commits:
            generation, member = int(op.value["generation"]), op.value["member"]
            other = holders.setdefault(generation, member)
            if other != member:
                out.add(
                    "member-overlap",
                    f"{subscription}/{vchannel}: {other} and {member} both committed under "
                    f"generation {generation}",
                )
        # Newest generation whose commit completed, as time goes on.
        done = sorted(commits, key=lambda o: o.complete_s)
        for op in commits:
            generation = int(op.value["generation"])
            for newer in done:
                if newer.complete_s >= op.invoke_s:
                    break
                if int(newer.value["generation"]) > generation and (
                    newer.value["member"] != op.value["member"]
                ):
                    out.add(
                        "member-overlap",
                        f"{subscription}/{vchannel}: {op.value['member']} committed lsn "
                        f"{op.value['lsn']} under generation {generation} at "
                        f"{_t(op.invoke_s)}, after {newer.value['member']} had committed "
                        f"under generation {newer.value['generation']} at "
                        f"{_t(newer.complete_s)}",
                    )
                    break


def check_packs(
    history: History,
    logs: Mapping[str, Sequence[LogEntry]],
    vchannel_pchannel: Mapping[str, str],
    out: _Violations,
    floors: Mapping[str, int],
) -> None:
    """Every pack in order after the previous one of its consumer, and complete (compared
    with the final logs from the retention floor on)."""
    previous: dict[tuple[str, int], Op] = {}
    ticks: dict[str, list[tuple[int, tuple[str, int]]]] = {}
    for op in _ops(history, "pack"):
        if op.outcome != OK:
            continue
        r = op.result
        begin, end = int(r["begin"]), int(r["end"])
        name = f"{op.value['subscription']} pack ({begin}, {end}]"
        stream = (op.value["subscription"], int(op.value["incarnation"]))
        before = previous.get(stream)
        if before is not None and int(before.result["end"]) != begin:
            out.add(
                "pack-order",
                f"{name} follows a pack ending at {before.result['end']} (consumer {stream[1]})",
            )
        previous[stream] = op
        if end <= begin:
            out.add("pack-order", f"{name}: end not after begin")
        messages = [(str(v), int(lsn), int(tick)) for v, lsn, tick in r["messages"]]
        ordered = sorted(messages, key=lambda m: (m[2], m[0], m[1]))
        if messages != ordered:
            out.add("pack-order", f"{name}: messages not in (time tick, vchannel, lsn) order")
        outside = [m for m in messages if not begin < m[2] <= end]
        if outside:
            out.add("pack-order", f"{name}: {len(outside)} messages outside it, e.g. {outside[0]}")
        vchannels = sorted(r["end_positions"])
        got = {(m[0], m[1]) for m in messages}
        if len(got) != len(messages):
            out.add("pack-duplicate", f"{name}: a message twice")
        got = {(v, lsn) for v, lsn in got if lsn >= floors.get(vchannel_pchannel.get(v, ""), 1)}
        expected: set[tuple[str, int]] = set()
        readable = True
        for vchannel in vchannels:
            if vchannel not in ticks:
                entries = _data_entries(logs, vchannel_pchannel, vchannel)
                if entries is None:
                    readable = False
                    continue
                ticks[vchannel] = sorted((e.time_tick, (vchannel, e.lsn)) for e in entries)
            row = ticks[vchannel]
            low = bisect.bisect_right(row, (begin, ("\uffff", math.inf)))  # type: ignore[arg-type]
            high = bisect.bisect_right(row, (end, ("\uffff", math.inf)))  # type: ignore[arg-type]
            expected.update(position for _, position in row[low:high])
        if not readable:
            continue
        for vchannel, lsn in sorted(expected - got)[:3]:
            out.add("pack-incomplete", f"{name}: committed {vchannel} lsn {lsn} missing")
        for vchannel, lsn in sorted(got - expected)[:3]:
            out.add("pack-uncommitted", f"{name}: {vchannel} lsn {lsn} is no committed entry")


def check_replica_holders(final: FinalState, out: _Violations) -> None:
    """Once converged, a majority of each pchannel's replica set (its owner included)
    holds every committed entry, and no member holds anything else at those LSNs: what
    replica repair must preserve through every set change."""
    for pchannel, (owner, members) in sorted(final.replica_sets.items()):
        log = final.logs.get(pchannel)
        if log is None or pchannel in final.log_errors:
            continue
        expected = [(e.lsn, e.term, e.digest) for e in log]
        holders = [owner]
        for node_id in members:
            if node_id == owner:
                continue
            theirs = final.replica_logs.get(pchannel, {}).get(node_id)
            if isinstance(theirs, str) or theirs is None:
                continue
            # Read after the owner's log: it may have a few (time-tick) entries more.
            got = [(e.lsn, e.term, e.digest) for e in theirs]
            common = min(len(got), len(expected))
            if got[:common] != expected[:common]:
                first = next(i for i in range(common) if got[i] != expected[i])
                out.add(
                    "replica-log",
                    f"{pchannel}: replica {node_id}'s committed log differs from the owner "
                    f"{owner}'s at lsn {expected[first][0]} (term {got[first][1]} vs "
                    f"{expected[first][1]})",
                )
            elif len(got) >= len(expected):
                holders.append(node_id)
        if len(holders) < len(members) // 2 + 1:
            unread = {
                n: v for n, v in final.replica_logs.get(pchannel, {}).items() if isinstance(v, str)
            }
            out.add(
                "replica-holders",
                f"{pchannel}: only {', '.join(holders)} of its set {', '.join(members)} hold all "
                f"{len(expected)} committed entries (unreadable: {unread or 'none'})",
            )


def check(
    history: History,
    deliveries: Mapping[str, Sequence[Delivery]],
    samples: Sequence[StatusSample],
    vchannel_pchannel: Mapping[str, str],
    final: FinalState,
) -> list[Violation]:
    """Every check above, in a stable order."""
    out = _Violations()
    if final.recovery_error:
        out.add("recovery", final.recovery_error)
    if final.membership_error:
        out.add("membership", final.membership_error)
    for pchannel, error in sorted(final.log_errors.items()):
        out.add("unreadable-log", f"{pchannel}: {error}")
    complete = {p for p in final.logs if p not in final.log_errors}
    logs = {p: e for p, e in final.logs.items() if p in complete}
    floors = final.floors
    check_logs(logs, out, floors)
    check_produce(history, logs, vchannel_pchannel, out, floors)
    check_consumers(deliveries, vchannel_pchannel, final.logs, complete, out, floors)
    check_locks(history, out)
    check_lock_beliefs(history, out)
    check_broadcasts(history, logs, complete, vchannel_pchannel, out, floors)
    check_terms(samples, out)
    check_exactly_once(history, logs, vchannel_pchannel, out, floors)
    check_positions(history, out)
    check_member_generations(history, out)
    check_packs(history, logs, vchannel_pchannel, out, floors)
    if not final.converged:
        out.add("divergence", final.convergence_detail)
    if final.replica_detail:
        out.add("replica-stuck", final.replica_detail)
    check_segments(final, out)
    check_replica_holders(final, out)
    check_spark(final, out)
    return out.result()
