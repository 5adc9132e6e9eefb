"""Property tests: random command sequences through ``apply_command``, checked after every step.

A hypothesis ``RuleBasedStateMachine`` has one rule per command kind. Names come from small
pools so that conflicts, repeats and cross-references happen often; lease and broadcast
ids come from Bundles (so ended ones are reused too). After every step it checks
``invariants.violations`` plus what the test tracks itself across the whole run:

- the revision moves by exactly one per event, events carry consecutive revisions and the
  clamped proposer time;
- pchannel terms never decrease, and a (pchannel, term) is assigned at most once ever;
- committed segment ranges never overlap any range ever committed (deleted ones included);
- an EXCLUSIVE key has one holder and no SHARED holder; only PENDING broadcasts hold keys;
  expired or revoked leases hold nothing; fencing tokens only grow;
- a rejected command changes nothing but the apply metadata, and says why;
- a request id already applied is answered from the window, without changing anything.

Locks, leases, broadcasts and the request-id window are also run against a deliberately
naive dict model (``NaiveModel``) that predicts each such command's outcome code and the
resulting tables; the two must agree after every step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
from helpers import EXCLUSIVE, NOW, SHARED, E, Harness, code_name, domain_bytes, kinds
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    multiple,
    rule,
    run_state_machine_as_test,
)

from rpc.protos import coordination_pb2 as pb
from statemachine import copy_state
from statemachine.balancer import plan_subscriptions
from statemachine.invariants import violations

NODES = ["n1", "n2", "n3", "n4"]
PCHANNELS = ["p1", "p2", "p3", "q_0", "q_1"]
VCHANNELS = ["v1", "v2", "v3", "v4"]
KEYS = ["k1", "k2", "k3"]
GROUPS = ["g1", "g2"]
LEASE = pb.HOLDER_KIND_LEASE
BROADCAST = pb.HOLDER_KIND_BROADCAST
UNKNOWN_ID = 999_999

# (proposer time offset from the test's wall clock, request id choice). A negative offset
# is a proposer whose clock is behind (a new leader): the state machine clock must not go
# back. Request ids: none, a fresh one, or the last one used again (a retry that carries a
# different body must still get the first answer).
META = st.tuples(
    st.sampled_from([0, 0, 0, 1, 700, 5_000, 30_000, -2_000]),
    st.sampled_from(["", "", "", "", "", "", "new", "new", "reuse"]),
)
MODES = st.sampled_from([EXCLUSIVE, EXCLUSIVE, SHARED, SHARED, 0])
TTLS = st.sampled_from([0, 1, 1_000, 60_000, 600_000, 600_000, 600_000])
# Mostly the pchannels and vchannels the populated start creates (p1 is assigned).
PCHANNEL_NAMES = st.sampled_from(["p1", "p1", "p1", "p2", "p2", "p3", "q_0", "q_1"])
VCHANNEL_NAMES = st.sampled_from(["v1", "v1", "v2", "v2", "v3", "v4"])
# Now and then an id that was never handed out instead of one from a Bundle.
BOGUS = st.sampled_from([False, False, False, False, False, True])
LIVE_NODES = st.sampled_from(["n1", "n1", "n2", "n3", "n4"])


@dataclass
class NaiveModel:
    """Locks, leases and broadcasts as plain dicts, following the documented rules."""

    # lease id -> [ttl_ms, deadline_ms, set of keys]
    leases: dict[int, list] = field(default_factory=dict)
    # key -> {(holder kind, holder id): (fencing token, requested mode)}
    locks: dict[str, dict[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    # broadcast id -> dict(state, keys, targets, acked, tombstoned_at, idempotency, content)
    broadcasts: dict[int, dict] = field(default_factory=dict)
    idempotency: dict[str, int] = field(default_factory=dict)
    # Reply fields the real result must carry when the prediction is OK.
    reply: dict[str, int] = field(default_factory=dict)

    def _mode(self, key: str) -> int:
        return next(iter(self.locks[key].values()))[1]

    def _conflict(self, key: str, mode: int, holder: tuple[int, int]) -> bool:
        others = [h for h in self.locks.get(key, {}) if h != holder]
        return bool(others) and (mode == EXCLUSIVE or self._mode(key) == EXCLUSIVE)

    def _acquire(self, key: str, mode: int, holder: tuple[int, int], token: int) -> None:
        self.locks.setdefault(key, {})[holder] = (token, mode)
        if holder[0] == LEASE:
            self.leases[holder[1]][2].add(key)

    def _release(self, key: str, holder: tuple[int, int]) -> None:
        del self.locks[key][holder]
        if not self.locks[key]:
            del self.locks[key]
        if holder[0] == LEASE:
            self.leases[holder[1]][2].discard(key)

    def _end_lease(self, lease_id: int) -> None:
        for key in sorted(self.leases[lease_id][2]):
            self._release(key, (LEASE, lease_id))
        del self.leases[lease_id]

    def predict(self, command: pb.Command, now: int, revision: int, live: set[str]) -> int | None:
        """The outcome code of `command` (updating the model), or None if not modelled."""
        kind = command.WhichOneof("body")
        body = getattr(command, kind) if kind else None
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            return None
        return handler(body, now, revision, live)

    def _grant_lease(self, body, now, revision, live) -> int:
        if not 1 <= body.ttl_ms <= 3_600_000:
            return E.INVALID_ARGUMENT
        self.leases[revision + 1] = [body.ttl_ms, now + body.ttl_ms, set()]
        self.reply = {"lease_id": revision + 1, "lease_deadline_ms": now + body.ttl_ms}
        return E.OK

    def _live_lease(self, lease_id: int, now: int) -> int:
        if lease_id <= 0:
            return E.INVALID_ARGUMENT
        if lease_id not in self.leases or self.leases[lease_id][1] <= now:
            return E.NOT_FOUND
        return E.OK

    def _keep_alive_lease(self, body, now, revision, live) -> int:
        code = self._live_lease(body.lease_id, now)
        if code == E.OK:
            lease = self.leases[body.lease_id]
            lease[1] = max(lease[1], now + lease[0])
            self.reply = {"lease_id": body.lease_id, "lease_deadline_ms": lease[1]}
        return code

    def _revoke_lease(self, body, now, revision, live) -> int:
        if body.lease_id <= 0:
            return E.INVALID_ARGUMENT
        if body.lease_id not in self.leases:
            return E.NOT_FOUND
        self._end_lease(body.lease_id)
        return E.OK

    def _expire_leases(self, body, now, revision, live) -> int:
        for lease_id in sorted(self.leases):
            if self.leases[lease_id][1] <= now:
                self._end_lease(lease_id)
        return E.OK

    def _extend_leases(self, body, now, revision, live) -> int:
        for lease in self.leases.values():
            lease[1] = max(lease[1], now + lease[0])
        return E.OK

    def _lock(self, body, now, revision, live) -> int:
        if body.mode not in (EXCLUSIVE, SHARED):
            return E.INVALID_ARGUMENT
        code = self._live_lease(body.lease_id, now)
        if code != E.OK:
            return code
        holder = (LEASE, body.lease_id)
        if body.key in self.leases[body.lease_id][2]:
            if self._mode(body.key) != body.mode:
                return E.INVALID_ARGUMENT
        elif self._conflict(body.key, body.mode, holder):
            return E.RESOURCE_ACQUIRED
        else:
            self._acquire(body.key, body.mode, holder, revision + 1)
        self.reply = {"fencing_token": self.locks[body.key][holder][0]}
        return E.OK

    def _unlock(self, body, now, revision, live) -> int:
        if body.lease_id not in self.leases:
            return E.NOT_FOUND
        if body.key in self.leases[body.lease_id][2]:
            self._release(body.key, (LEASE, body.lease_id))
        return E.OK

    def _create_broadcast(self, body, now, revision, live) -> int:
        content = (
            body.message,
            body.msg_type,
            list(body.vchannels),
            [(k.key, k.mode) for k in body.resource_keys],
        )
        if any(k.mode not in (EXCLUSIVE, SHARED) for k in body.resource_keys):
            return E.INVALID_ARGUMENT
        existing = self.idempotency.get(body.idempotency_key) if body.idempotency_key else None
        if existing is not None:
            if self.broadcasts[existing]["content"] != content:
                return E.ALREADY_EXISTS
            self.reply = {"broadcast_id": existing}
            return E.OK
        if any(name not in live for name in body.vchannels):
            return E.CHANNEL_NOT_EXIST
        broadcast_id = revision + 1
        holder = (BROADCAST, broadcast_id)
        if any(self._conflict(k.key, k.mode, holder) for k in body.resource_keys):
            return E.RESOURCE_ACQUIRED
        for offset, resource in enumerate(sorted(body.resource_keys, key=lambda k: k.key)):
            self._acquire(resource.key, resource.mode, holder, broadcast_id + 1 + offset)
        self.broadcasts[broadcast_id] = {
            "state": pb.BROADCAST_STATE_PENDING,
            "keys": sorted(k.key for k in body.resource_keys),
            "targets": list(body.vchannels),
            "acked": set(),
            "tombstoned_at": 0,
            "idempotency": body.idempotency_key,
            "content": content,
        }
        if body.idempotency_key:
            self.idempotency[body.idempotency_key] = broadcast_id
        self.reply = {"broadcast_id": broadcast_id}
        return E.OK

    def _ack_broadcast(self, body, now, revision, live) -> int:
        task = self.broadcasts.get(body.broadcast_id)
        if task is None:
            return E.NOT_FOUND
        if body.vchannel not in task["targets"]:
            return E.INVALID_ARGUMENT
        if body.vchannel in task["acked"]:
            return E.OK
        task["acked"].add(body.vchannel)
        if task["acked"] == set(task["targets"]):
            for key in task["keys"]:
                self._release(key, (BROADCAST, body.broadcast_id))
            task["state"] = pb.BROADCAST_STATE_TOMBSTONE
            task["tombstoned_at"] = now
        return E.OK

    def _clear_broadcasts(self, body, now, revision, live) -> int:
        if not 0 <= body.retention_ms <= 30 * 24 * 3_600_000:
            return E.INVALID_ARGUMENT
        for broadcast_id in sorted(self.broadcasts):
            task = self.broadcasts[broadcast_id]
            if (
                task["state"] == pb.BROADCAST_STATE_TOMBSTONE
                and task["tombstoned_at"] + body.retention_ms <= now
            ):
                if task["idempotency"]:
                    del self.idempotency[task["idempotency"]]
                del self.broadcasts[broadcast_id]
        return E.OK

    def _record_broadcast_appended(self, body, now, revision, live) -> int | None:
        task = self.broadcasts.get(body.broadcast_id)
        if task is None:
            return E.NOT_FOUND
        if body.vchannel not in task["targets"]:
            return E.INVALID_ARGUMENT
        return None  # appended positions are not modelled


class CoordinationMachine(RuleBasedStateMachine):
    leases = Bundle("leases")
    broadcasts = Bundle("broadcasts")

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.wall_clock = NOW
        self.sm_clock = 0
        self.model = NaiveModel()
        self.owners: dict[tuple[str, int], str] = {}
        self.committed: dict[str, list[tuple[int, int]]] = {}
        self.ended_leases: set[int] = set()
        self.max_token = 0
        self.window: dict[str, pb.CommandResult] = {}
        self.last_request_id = ""
        self.last_command: pb.Command | None = None

    @initialize(populate=st.sampled_from([True, True, True, False]))
    def setup(self, populate: bool) -> None:
        """Usually start from a small cluster, so that deep paths are reached in few steps."""
        if not populate:
            return
        meta = (0, "")
        for node in NODES[:3]:
            self.step(meta, register_node=pb.RegisterNode(node_id=node, address="h:1"))
        self.step(meta, create_pchannels=pb.CreatePChannels(names=["p1", "p2"]))
        self.step(meta, assign_pchannel=pb.AssignPChannel(pchannel="p1", term=1, node_id="n1"))
        self.step(
            meta,
            pchannel_ready=pb.PChannelReady(pchannel="p1", term=1, node_id="n1", start_lsn=1),
        )
        for name, pchannel in (("v1", "p1"), ("v2", "p1"), ("v3", "p2")):
            self.step(meta, create_vchannel=pb.CreateVChannel(name=name, pchannel=pchannel))
        assert self.h.state.revision == 10, [r.rejection.message for r in self.h.results]

    # ---- the step every rule goes through

    def step(self, meta: tuple[int, str], **body: object) -> pb.CommandResult:
        offset, choice = meta
        proposed = self.wall_clock + offset
        self.wall_clock = max(self.wall_clock, proposed)
        request_id = ""
        if choice == "new" or (choice == "reuse" and not self.window):
            request_id = f"req-{len(self.window) + 1}"
        elif choice == "reuse":
            request_id = self.last_request_id
        command = pb.Command(request_id=request_id, proposed_at_ms=proposed, **body)
        self.last_command = command
        return self.apply(command)

    @rule(offset=st.sampled_from([0, 1_000]))
    def retry_last_command(self, offset: int) -> None:
        """The proposer retries after an unknown outcome (same request id, later time)."""
        if self.last_command is None:
            return
        command = pb.Command()
        command.CopyFrom(self.last_command)
        command.proposed_at_ms += offset
        self.apply(command)

    def apply(self, command: pb.Command) -> pb.CommandResult:
        state = self.h.state
        previous = copy_state(state)
        before = domain_bytes(state)
        duplicate = self.window.get(command.request_id) if command.request_id else None
        now = max(self.sm_clock, command.proposed_at_ms)
        live = {n for n, v in state.vchannels.items() if v.state == pb.VCHANNEL_STATE_NORMAL}
        model = copy.deepcopy(self.model)
        model.reply = {}
        predicted = None if duplicate else model.predict(command, now, state.revision, live)

        result = self.h.apply(command)
        events = list(result.events)
        code = result.rejection.code

        problems = violations(state, previous, events)
        assert problems == [], problems
        assert state.last_raft_index == self.h.raft_index

        if duplicate is not None:
            assert result.deduplicated
            replay = pb.CommandResult()
            replay.CopyFrom(result)
            replay.deduplicated = False
            assert replay == duplicate
            assert events == [] and domain_bytes(state) == before
            assert state.last_time_ms == self.sm_clock
            return result

        assert not result.deduplicated
        self.sm_clock = now
        assert state.last_time_ms == now
        if predicted is not None:
            assert code == predicted, (
                f"model predicted {code_name(predicted)}, got {code_name(code)} "
                f"{result.rejection.message!r} for {command}"
            )
        if code == E.OK:
            self.model = model
            for name, value in model.reply.items():
                assert getattr(result, name) == value, (name, getattr(result, name), value)
        else:
            assert result.rejection.message, "a rejection must say why"
            assert events == [] and domain_bytes(state) == before
        if command.request_id:
            self.last_request_id = command.request_id
            stored = pb.CommandResult()
            stored.CopyFrom(result)
            stored.ClearField("events")
            self.window[command.request_id] = stored

        # Revisions and time.
        assert [e.revision for e in events] == list(
            range(previous.revision + 1, previous.revision + 1 + len(events))
        )
        assert state.revision == result.revision == previous.revision + len(events)
        assert all(e.time_ms == now and e.raft_index == self.h.raft_index for e in events)
        self.check_history(previous, events)
        self.check_tables()
        return result

    def check_retention(self, previous: pb.CoordinationState, events: list[pb.Event]) -> None:
        """The retention floor never moves backwards, and never passes what a holding
        subscription (from its start, or its committed position) or an unacknowledged
        broadcast still needs; a seek never lands below it."""
        state = self.h.state
        for name, manifest in previous.manifests.items():
            if name in state.manifests:
                assert state.manifests[name].deleted_before_lsn >= manifest.deleted_before_lsn
        for event in events:
            kind = event.WhichOneof("body")
            if (
                kind == "subscription_position_committed"
                and event.subscription_position_committed.seek
            ):
                committed = event.subscription_position_committed
                vchannel = state.vchannels[committed.vchannel]
                floor = (
                    state.manifests[vchannel.pchannel].deleted_before_lsn
                    if (vchannel.pchannel in state.manifests)
                    else 0
                )
                if committed.position.lsn:
                    assert committed.position.lsn + 1 >= floor, (committed, floor)
            if kind != "segments_deleted":
                continue
            pchannel = event.segments_deleted.pchannel
            before = previous.manifests[pchannel].deleted_before_lsn
            after = state.manifests[pchannel].deleted_before_lsn
            assert after > before
            for subscription in previous.subscriptions.values():
                if not subscription.holds_retention:
                    continue
                for vchannel_name in subscription.vchannels:
                    vchannel = previous.vchannels.get(vchannel_name)
                    if vchannel is None or vchannel.pchannel != pchannel:
                        continue
                    if vchannel.state != pb.VCHANNEL_STATE_NORMAL:
                        continue
                    needed = None
                    if vchannel_name in subscription.positions:
                        position = subscription.positions[vchannel_name]
                        if position.lsn:
                            needed = position.lsn + 1
                        elif not position.from_time_tick:
                            needed = 1
                    elif subscription.start == pb.SUBSCRIPTION_START_EARLIEST:
                        needed = 1
                    elif subscription.start == pb.SUBSCRIPTION_START_LSN:
                        needed = subscription.start_lsn
                    if needed is not None:
                        assert after <= max(needed, before), (subscription, after, before)
            for task in previous.broadcasts.values():
                if task.state != pb.BROADCAST_STATE_PENDING:
                    continue
                for target in task.vchannels:
                    vchannel = previous.vchannels.get(target.vchannel)
                    if (
                        target.appended
                        and not target.acked
                        and vchannel is not None
                        and (vchannel.pchannel == pchannel)
                    ):
                        assert after <= max(target.appended_lsn, before), (task, after)

    def check_history(self, previous: pb.CoordinationState, events: list[pb.Event]) -> None:
        state = self.h.state
        self.check_retention(previous, events)
        for name, channel in previous.pchannels.items():
            assert state.pchannels[name].term >= channel.term
        for event in events:
            kind = event.WhichOneof("body")
            if kind == "pchannel_assigned":
                key = (event.pchannel_assigned.pchannel, event.pchannel_assigned.term)
                assert key not in self.owners, f"{key} assigned twice"
                self.owners[key] = event.pchannel_assigned.node_id
            elif kind == "segment_committed":
                segment = event.segment_committed.segment
                ranges = self.committed.setdefault(segment.pchannel, [])
                for first, last in ranges:
                    assert segment.last_lsn < first or segment.first_lsn > last, (
                        f"{segment.pchannel} [{segment.first_lsn}, {segment.last_lsn}] overlaps "
                        f"[{first}, {last}]"
                    )
                ranges.append((segment.first_lsn, segment.last_lsn))
            elif kind == "lock_acquired":
                token = event.lock_acquired.fencing_token
                assert token == event.revision and token > self.max_token
                self.max_token = token
            elif kind in ("lease_expired", "lease_revoked"):
                self.ended_leases.add(getattr(event, kind).lease_id)
        for name, channel in state.pchannels.items():
            if channel.term > 0 and channel.state != pb.PCHANNEL_STATE_DROPPED:
                assert self.owners[(name, channel.term)] == channel.owner_node_id

    def check_tables(self) -> None:
        state = self.h.state
        real_locks = {
            key: [(h.kind, h.id, h.fencing_token) for h in lock.holders]
            for key, lock in state.locks.items()
        }
        model_locks = {
            key: sorted(((k, i, t) for (k, i), (t, _) in holders.items()), key=lambda x: x[2])
            for key, holders in self.model.locks.items()
        }
        assert real_locks == model_locks
        for key, lock in state.locks.items():
            if lock.mode == EXCLUSIVE:
                assert len(lock.holders) == 1, f"EXCLUSIVE {key} held by {real_locks[key]}"
            for holder in lock.holders:
                assert not (holder.kind == LEASE and holder.id in self.ended_leases)
                if holder.kind == BROADCAST:
                    assert state.broadcasts[holder.id].state == pb.BROADCAST_STATE_PENDING
                # Every holder asked for the mode the lock is in (no SHARED under EXCLUSIVE).
                assert self.model.locks[key][(holder.kind, holder.id)][1] == lock.mode
        assert not self.ended_leases & set(state.leases)
        real_leases = {
            i: (lease.deadline_ms, list(lease.locked_keys)) for i, lease in state.leases.items()
        }
        model_leases = {i: (lease[1], sorted(lease[2])) for i, lease in self.model.leases.items()}
        assert real_leases == model_leases
        real_broadcasts = {
            i: (t.state, sorted(v.vchannel for v in t.vchannels if v.acked))
            for i, t in state.broadcasts.items()
        }
        model_broadcasts = {
            i: (t["state"], sorted(t["acked"])) for i, t in self.model.broadcasts.items()
        }
        assert real_broadcasts == model_broadcasts
        assert dict(state.broadcast_idempotency) == self.model.idempotency

    # ---- helpers for drawing values that depend on the state

    def term(self, pchannel: str) -> int:
        channel = self.h.state.pchannels.get(pchannel)
        return channel.term if channel is not None else 0

    def through(self, pchannel: str) -> int:
        manifest = self.h.state.manifests.get(pchannel)
        return manifest.committed_through_lsn if manifest is not None else 0

    # ---- nodes

    @rule(meta=META, node=st.sampled_from(NODES), port=st.sampled_from([1, 2]))
    def register_node(self, meta, node, port) -> None:
        self.step(meta, register_node=pb.RegisterNode(node_id=node, address=f"h:{port}"))

    @rule(meta=META, node=st.sampled_from(NODES), down=st.booleans())
    def mark_node(self, meta, node, down) -> None:
        if down:
            self.step(meta, mark_node_down=pb.MarkNodeDown(node_id=node))
        else:
            self.step(meta, mark_node_up=pb.MarkNodeUp(node_id=node))

    @rule(meta=META, node=st.sampled_from(NODES), frozen=st.booleans())
    def freeze_node(self, meta, node, frozen) -> None:
        if frozen:
            self.step(meta, freeze_node=pb.FreezeNode(node_id=node))
        else:
            self.step(meta, unfreeze_node=pb.UnfreezeNode(node_id=node))

    @rule(meta=META, node=st.sampled_from(NODES), rejoin=st.booleans())
    def remove_node(self, meta, node, rejoin) -> None:
        if not rejoin:
            self.step(meta, remove_node=pb.RemoveNode(node_id=node))
            return
        # A process started with --join now (after any removal so far).
        self.step(
            meta,
            register_node=pb.RegisterNode(
                node_id=node, address="h:1", joined_incarnation_ms=self.wall_clock + 1
            ),
        )

    # ---- pchannels

    @rule(
        meta=META,
        names=st.lists(st.sampled_from(PCHANNELS[:3]), min_size=0, max_size=2),
        count=st.integers(1, 2),
        replica_count=st.sampled_from([0, 2, 3, 9]),
    )
    def create_pchannels(self, meta, names, count, replica_count) -> None:
        body = pb.CreatePChannels(names=names, replica_count=replica_count)
        if not names:
            body.prefix, body.count = "q", count
        self.step(meta, create_pchannels=body)

    @rule(
        meta=META,
        pchannel=PCHANNEL_NAMES,
        term_offset=st.sampled_from([1, 1, 1, 0, 2]),
        node=LIVE_NODES,
        replicas=st.lists(LIVE_NODES, max_size=3),
        access_mode=st.sampled_from([0, 1, 2]),
    )
    def assign_pchannel(self, meta, pchannel, term_offset, node, replicas, access_mode) -> None:
        self.step(
            meta,
            assign_pchannel=pb.AssignPChannel(
                pchannel=pchannel,
                term=self.term(pchannel) + term_offset,
                node_id=node,
                replica_node_ids=replicas,
                access_mode=access_mode,
            ),
        )

    @rule(
        meta=META,
        pchannel=PCHANNEL_NAMES,
        term_offset=st.sampled_from([0, 0, 0, -1, 1]),
        other_node=st.one_of(st.none(), st.sampled_from(NODES)),
        start=st.sampled_from(["next", "next", "one", "zero"]),
    )
    def pchannel_ready(self, meta, pchannel, term_offset, other_node, start) -> None:
        channel = self.h.state.pchannels.get(pchannel)
        owner = channel.owner_node_id if channel is not None else "n1"
        start_lsn = {"next": self.through(pchannel) + 1, "one": 1, "zero": 0}[start]
        self.step(
            meta,
            pchannel_ready=pb.PChannelReady(
                pchannel=pchannel,
                term=self.term(pchannel) + term_offset,
                node_id=other_node or owner or "n1",
                start_lsn=start_lsn,
            ),
        )

    @rule(meta=META, pchannel=PCHANNEL_NAMES, term_offset=st.sampled_from([0, 0, 1]))
    def mark_pchannel_unavailable(self, meta, pchannel, term_offset) -> None:
        self.step(
            meta,
            mark_pchannel_unavailable=pb.MarkPChannelUnavailable(
                pchannel=pchannel, term=self.term(pchannel) + term_offset
            ),
        )

    @rule(meta=META, pchannel=PCHANNEL_NAMES)
    def drop_pchannel(self, meta, pchannel) -> None:
        self.step(meta, drop_pchannel=pb.DropPChannel(pchannel=pchannel))

    # ---- vchannels

    @rule(meta=META, name=VCHANNEL_NAMES, pchannel=PCHANNEL_NAMES)
    def create_vchannel(self, meta, name, pchannel) -> None:
        self.step(meta, create_vchannel=pb.CreateVChannel(name=name, pchannel=pchannel))

    @rule(meta=META, name=VCHANNEL_NAMES)
    def drop_vchannel(self, meta, name) -> None:
        self.step(meta, drop_vchannel=pb.DropVChannel(name=name))

    # ---- segments

    @rule(
        meta=META,
        pchannel=PCHANNEL_NAMES,
        term_offset=st.sampled_from([0, 0, 0, -1]),
        start=st.sampled_from(["next", "next", "next", "repeat", "overlap", "gap"]),
        length=st.integers(1, 5),
        wrong_count=BOGUS,
        replicas=st.lists(LIVE_NODES, min_size=1, max_size=2, unique=True),
    )
    def commit_segment(self, meta, pchannel, term_offset, start, length, wrong_count, replicas):
        through = self.through(pchannel)
        term = self.term(pchannel) + term_offset
        first = {
            "next": through + 1,
            "repeat": max(1, through - length + 1),
            "overlap": max(1, through - 1),
            "gap": through + 3,
        }[start]
        last = first + length - 1
        self.step(
            meta,
            commit_segment=pb.CommitSegment(
                pchannel=pchannel,
                term=term,
                first_lsn=first,
                last_lsn=last,
                first_term=1,
                last_term=max(1, term),
                first_time_tick=first,
                last_time_tick=last,
                count=length + (1 if wrong_count and start == "next" else 0),
                bytes=10 * length,
                digest=first * 31 + last,
                replica_node_ids=replicas,
            ),
        )

    @rule(
        meta=META,
        pchannel=PCHANNEL_NAMES,
        back=st.sampled_from([0, 0, 3, 1000]),
    )
    def delete_segments_before(self, meta, pchannel, back) -> None:
        before = max(1, self.through(pchannel) + 1 - back)
        self.step(
            meta,
            delete_segments_before=pb.DeleteSegmentsBefore(pchannel=pchannel, before_lsn=before),
        )

    # ---- broadcasts

    @rule(
        target=broadcasts,
        meta=META,
        vchannels=st.lists(VCHANNEL_NAMES, min_size=1, max_size=2, unique=True),
        keys=st.lists(
            st.tuples(st.sampled_from(KEYS), MODES), max_size=2, unique_by=lambda k: k[0]
        ),
        idempotency_key=st.sampled_from(["", "", "i1", "i2"]),
        message=st.sampled_from([b"a", b"b"]),
    )
    def create_broadcast(self, meta, vchannels, keys, idempotency_key, message):
        result = self.step(
            meta,
            create_broadcast=pb.CreateBroadcast(
                message=message,
                msg_type="Ddl",
                vchannels=vchannels,
                resource_keys=[pb.ResourceKey(key=k, mode=m) for k, m in keys],
                idempotency_key=idempotency_key,
            ),
        )
        return result.broadcast_id if result.broadcast_id else multiple()

    def pending(self, broadcast_id: int, pick: int | None) -> int:
        """`broadcast_id`, or (when `pick` is set) one of the PENDING tasks of the state."""
        if pick is None:
            return broadcast_id
        state = self.h.state
        ids = sorted(
            i for i, t in state.broadcasts.items() if t.state == pb.BROADCAST_STATE_PENDING
        )
        return ids[pick % len(ids)] if ids else broadcast_id

    def target(self, broadcast_id: int, name: str | None) -> str:
        """`name`, or (when None) a not yet acked target of the broadcast."""
        if name is not None:
            return name
        task = self.h.state.broadcasts.get(broadcast_id)
        targets = [v.vchannel for v in task.vchannels if not v.acked] if task else []
        return targets[0] if targets else "v1"

    @rule(
        meta=META,
        broadcast_id=broadcasts,
        bogus=BOGUS,
        name=st.one_of(st.none(), VCHANNEL_NAMES),
        lsn=st.integers(1, 3),
        pick=st.one_of(st.none(), st.integers(0, 3)),
    )
    def record_broadcast_appended(self, meta, broadcast_id, bogus, name, lsn, pick) -> None:
        broadcast_id = UNKNOWN_ID if bogus else self.pending(broadcast_id, pick)
        self.step(
            meta,
            record_broadcast_appended=pb.RecordBroadcastAppended(
                broadcast_id=broadcast_id,
                vchannel=self.target(broadcast_id, name),
                lsn=lsn,
                time_tick=lsn,
            ),
        )

    @rule(
        meta=META,
        broadcast_id=broadcasts,
        bogus=BOGUS,
        name=st.one_of(st.none(), st.none(), VCHANNEL_NAMES),
        pick=st.one_of(st.none(), st.integers(0, 3)),
    )
    def ack_broadcast(self, meta, broadcast_id, bogus, name, pick) -> None:
        broadcast_id = UNKNOWN_ID if bogus else self.pending(broadcast_id, pick)
        self.step(
            meta,
            ack_broadcast=pb.AckBroadcast(
                broadcast_id=broadcast_id, vchannel=self.target(broadcast_id, name), checkpoint=1
            ),
        )

    @rule(meta=META, retention_ms=st.sampled_from([0, 1_000, 60_000, -1]))
    def clear_broadcasts(self, meta, retention_ms) -> None:
        self.step(meta, clear_broadcasts=pb.ClearBroadcasts(retention_ms=retention_ms))

    # ---- leases and locks

    @rule(target=leases, meta=META, ttl_ms=TTLS, owner=st.sampled_from(["", "id:a", "id:b"]))
    def grant_lease(self, meta, ttl_ms, owner):
        result = self.step(meta, grant_lease=pb.GrantLease(ttl_ms=ttl_ms, holder="t", owner=owner))
        # A deduplicated answer to another command carries no lease id.
        return result.lease_id if result.lease_id else multiple()

    @rule(meta=META, lease_id=leases, bogus=BOGUS)
    def keep_alive_lease(self, meta, lease_id, bogus) -> None:
        lease_id = UNKNOWN_ID if bogus else lease_id
        self.step(meta, keep_alive_lease=pb.KeepAliveLease(lease_id=lease_id))

    @rule(meta=META, lease_id=leases, bogus=BOGUS)
    def revoke_lease(self, meta, lease_id, bogus) -> None:
        lease_id = UNKNOWN_ID if bogus else lease_id
        self.step(meta, revoke_lease=pb.RevokeLease(lease_id=lease_id))

    @rule(meta=META)
    def expire_leases(self, meta) -> None:
        self.step(meta, expire_leases=pb.ExpireLeases())

    @rule(meta=META)
    def extend_leases(self, meta) -> None:
        self.step(meta, extend_leases=pb.ExtendLeases())

    @rule(meta=META, lease_id=leases, key=st.sampled_from(KEYS), mode=MODES)
    def lock(self, meta, lease_id, key, mode) -> None:
        self.step(meta, lock=pb.Lock(key=key, mode=mode, lease_id=lease_id))

    @rule(meta=META, lease_id=leases, bogus=BOGUS, key=st.sampled_from(KEYS))
    def unlock(self, meta, lease_id, bogus, key) -> None:
        lease_id = UNKNOWN_ID if bogus else lease_id
        self.step(meta, unlock=pb.Unlock(key=key, lease_id=lease_id))

    # ---- consumers, policy, barrier, garbage

    @rule(
        meta=META,
        group=st.sampled_from(GROUPS),
        name=VCHANNEL_NAMES,
        lsn=st.integers(0, 30),
        fence_offset=st.sampled_from([0, 0, 0, -1, 1]),
    )
    def commit_consumer_position(self, meta, group, name, lsn, fence_offset) -> None:
        groups = self.h.state.consumer_groups
        fence = groups[group].positions[name].fence if group in groups else 0
        self.step(
            meta,
            commit_consumer_position=pb.CommitConsumerPosition(
                group=group, vchannel=name, lsn=lsn, fence=max(0, fence + fence_offset)
            ),
        )

    @rule(meta=META, group=st.sampled_from(GROUPS), name=VCHANNEL_NAMES)
    def bump_consumer_fence(self, meta, group, name) -> None:
        self.step(meta, bump_consumer_fence=pb.BumpConsumerFence(group=group, vchannel=name))

    @rule(
        meta=META,
        group=st.sampled_from(GROUPS),
        names=st.lists(VCHANNEL_NAMES, min_size=0, max_size=3),
        start=st.sampled_from([0, 1, 2, 3, 4, 9]),
        start_lsn=st.sampled_from([0, 0, 5]),
    )
    def create_subscription(self, meta, group, names, start, start_lsn) -> None:
        self.step(
            meta,
            create_subscription=pb.CreateSubscription(
                name=group, vchannels=names, start=start, start_lsn=start_lsn
            ),
        )

    @rule(meta=META, group=st.sampled_from(GROUPS))
    def drop_subscription(self, meta, group) -> None:
        self.step(meta, drop_subscription=pb.DropSubscription(name=group))

    @rule(
        meta=META,
        group=st.sampled_from(GROUPS),
        member=st.sampled_from(["m1", "m2", "m3"]),
        lease_id=leases,
        leave=st.booleans(),
    )
    def subscription_member(self, meta, group, member, lease_id, leave) -> None:
        if leave:
            self.step(meta, leave_subscription=pb.LeaveSubscription(name=group, member_id=member))
        else:
            self.step(
                meta,
                join_subscription=pb.JoinSubscription(
                    name=group, member_id=member, lease_id=lease_id
                ),
            )

    @rule(meta=META)
    def balance_subscriptions(self, meta) -> None:
        for command in plan_subscriptions(self.h.state):
            kind = command.WhichOneof("body")
            self.step(meta, **{kind: getattr(command, kind)})

    @rule(
        meta=META,
        group=st.sampled_from(GROUPS),
        name=VCHANNEL_NAMES,
        lsn=st.integers(-1, 30),
        seek=st.booleans(),
        tick=st.sampled_from([0, 0, 1_000]),
    )
    def move_subscription(self, meta, group, name, lsn, seek, tick) -> None:
        if seek:
            body = pb.SeekSubscription(name=group, vchannel=name, lsn=lsn, from_time_tick=tick)
            self.step(meta, seek_subscription=body)
        else:
            body = pb.CommitSubscriptionPosition(name=group, vchannel=name, lsn=lsn, time_tick=tick)
            self.step(meta, commit_subscription_position=body)

    @rule(meta=META, allow=st.booleans(), moves=st.sampled_from([0, 3, 2_000]))
    def set_balance_policy(self, meta, allow, moves) -> None:
        self.step(
            meta,
            set_balance_policy=pb.SetBalancePolicy(
                allow_rebalance=allow, max_moves_per_round=moves
            ),
        )

    @rule(meta=META)
    def barrier(self, meta) -> None:
        self.step(meta, barrier=pb.Barrier())

    @rule(data=st.sampled_from([b"\xff\xff\xff", b"\x0a\x05ab", b"\x10"]))
    def undecodable(self, data) -> None:
        previous = copy_state(self.h.state)
        before = domain_bytes(self.h.state)
        result = self.h.apply_bytes(data)
        assert result.rejection.code == E.INVALID_ARGUMENT and result.rejection.message
        assert list(result.events) == [] and domain_bytes(self.h.state) == before
        assert self.h.state.last_time_ms == previous.last_time_ms == self.sm_clock


FAST = settings(
    max_examples=200,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# About two minutes here: ten times the examples, longer sequences.
LONG = settings(FAST, max_examples=2_000, stateful_step_count=120)


def test_random_command_sequences_keep_invariants_and_match_the_model() -> None:
    run_state_machine_as_test(CoordinationMachine, settings=FAST)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_random_command_sequences_long_run() -> None:
    run_state_machine_as_test(CoordinationMachine, settings=LONG)


def test_the_machine_reaches_interesting_states() -> None:
    """Guard against rules that can only produce rejections: one hand-driven run."""
    machine = CoordinationMachine()
    meta = (0, "")
    machine.setup(True)
    machine.commit_segment(meta, "p1", 0, "next", 3, False, ["n1"])
    broadcast_id = machine.create_broadcast(meta, ["v1"], [("k1", EXCLUSIVE)], "i1", b"a")
    lease_id = machine.grant_lease(meta, 10_000, "id:a")
    machine.lock(meta, lease_id, "k2", SHARED)
    machine.lock(meta, lease_id, "k1", SHARED)  # held by the broadcast: RESOURCE_ACQUIRED
    machine.record_broadcast_appended(meta, broadcast_id, False, None, 1, None)
    machine.ack_broadcast(meta, broadcast_id, False, None, None)
    machine.lock(meta, lease_id, "k1", EXCLUSIVE)
    machine.barrier((0, "new"))
    machine.retry_last_command(1_000)
    assert machine.h.results[-1].deduplicated
    machine.expire_leases((30_000, ""))
    state = machine.h.state
    assert kinds(machine.h.results[-1].events) == [
        "lock_released",
        "lock_released",
        "lease_expired",
    ]
    assert state.manifests["p1"].committed_through_lsn == 3
    assert state.broadcasts[broadcast_id].state == pb.BROADCAST_STATE_TOMBSTONE
    assert dict(state.locks) == {} and dict(state.leases) == {}
    assert [r.rejection.code for r in machine.h.results].count(E.RESOURCE_ACQUIRED) == 1
    assert all(r.rejection.code in (E.OK, E.RESOURCE_ACQUIRED) for r in machine.h.results)


def test_the_machine_checks_the_retention_floor() -> None:
    """A hand-driven run through the machine's rules (so `check_retention` judges every
    step): holding subscriptions and an unacknowledged broadcast stop the floor; it only
    rises; a seek below it is COMPACTED."""
    machine = CoordinationMachine()
    meta = (0, "")
    machine.setup(True)
    for _ in range(4):
        machine.commit_segment(meta, "p1", 0, "next", 5, False, ["n1"])
    assert machine.h.state.manifests["p1"].committed_through_lsn == 20
    # An EARLIEST subscription that never committed holds everything.
    machine.create_subscription(meta, "g1", ["v1"], pb.SUBSCRIPTION_START_EARLIEST, 0)
    machine.delete_segments_before(meta, "p1", 0)
    assert machine.h.state.manifests["p1"].deleted_before_lsn == 0
    # Consumed through 7: [1, 5] may go, [6, 10] not.
    machine.move_subscription(meta, "g1", "v1", 7, False, 0)
    machine.delete_segments_before(meta, "p1", 0)
    assert machine.h.state.manifests["p1"].deleted_before_lsn == 6
    # A broadcast appended at lsn 12 and not acknowledged holds [11, 15].
    broadcast_id = machine.create_broadcast(meta, ["v2"], [], "", b"b")
    machine.record_broadcast_appended(meta, broadcast_id, False, "v2", 12, None)
    machine.move_subscription(meta, "g1", "v1", 20, False, 0)
    machine.delete_segments_before(meta, "p1", 0)
    assert machine.h.state.manifests["p1"].deleted_before_lsn == 11
    # A seek below the floor is refused, one at it is fine.
    machine.move_subscription(meta, "g1", "v1", 3, True, 0)
    assert machine.h.results[-1].rejection.code == E.COMPACTED
    assert machine.h.results[-1].rejection.first_available == 11
    machine.move_subscription(meta, "g1", "v1", 11, True, 0)
    assert machine.h.results[-1].rejection.code == E.OK
    machine.ack_broadcast(meta, broadcast_id, False, "v2", None)
    machine.move_subscription(meta, "g1", "v1", 20, False, 0)
    machine.delete_segments_before(meta, "p1", 0)
    assert machine.h.state.manifests["p1"].deleted_before_lsn == 21
