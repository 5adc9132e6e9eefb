"""Bad input against a live three-node cluster: every RPC of every service, fuzzed.

The services and methods are enumerated from the generated descriptors of every
`rpc/protos/*_pb2` module, so a new RPC is fuzzed without touching this file. Requests are
built by hypothesis from the message descriptors: integers at and around the edges
(negative, huge), strings (empty, unicode, very long, and the names of the channels, nodes
and message types that exist, so that validation past the name checks is reached), bytes,
repeated fields with many elements, nested messages, maps, and enums with unknown values.
Streams get a few messages and are then closed by the client.

Every outcome must be a success or a gRPC status carrying an ErrorInfo detail; only our own
deadline or cancellation and the transport's message-size limit may come without one. After
the run every node still answers health SERVING, the replicas converge, the node processes
hold no more threads, file descriptors or asyncio tasks than before (bounded tolerance), and
the channels created before the run still take and serve writes: garbage was never applied.

Then the specific wrong sequences (AppendTxn before BeginTxn, CommitTxn twice, a Produce
stream that goes on after an error answer, Ack of an unknown broadcast, KeepAlive of an
unknown lease, Consume beyond the end, ReadSegment of a missing segment), and malformed
segment files placed in a pchannel's WAL directory on one node: reported, and not fatal to
the node's other pchannels.

``RAFTWAL_TEST_SEED`` replays a run; the default run keeps a few examples per method, the
``slow``-marked variant many more (``RAFTWAL_FUZZ_EXAMPLES`` overrides both).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import random
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

import rpc.protos
from raftwal.cli import dev
from rpc.placement import serving_address
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api, converged
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    setup_channels,
    wait_assigned,
)
from tests.timing import scaled
from wal_segments.format import Entry, FileHeader, MsgType, encode_file_header
from wal_segments.segment import SegmentWriter

pytestmark = pytest.mark.cluster
E = errors_pb2
SEED = int(os.environ.get("RAFTWAL_TEST_SEED", random.randrange(1 << 30)))
DEFAULT_EXAMPLES = 8
SLOW_EXAMPLES = 150
UNARY_TIMEOUT_S = scaled(5.0)
STREAM_TIMEOUT_S = scaled(1.0)
MAX_STREAM_RESPONSES = 4
# Checked after the run: the fuzzer never learns these names.
VCHANNELS = {"fz_v0": 0, "fz_v1": 1}
# Handed to the fuzzer: valid requests may legitimately drop or change them.
DECOYS = {"fd_v0": 0, "fd_v1": 1}
# Valid CreateChannels asking for more pchannels than this only load the cluster: skipped.
MAX_CREATED_PER_REQUEST = 4
# Outcomes that may come without an ErrorInfo: our own deadline or cancel, and the message
# size limit the gRPC transport enforces before any servicer runs.
NO_DETAIL_OK = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


def _services() -> list[tuple[str, MethodDescriptor]]:
    """(module name, method) of every RPC in every generated module of rpc/protos."""
    found = []
    for module_info in sorted(pkgutil.iter_modules(rpc.protos.__path__), key=lambda m: m.name):
        if not module_info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"rpc.protos.{module_info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                found.append((module_info.name, method))
    return found


METHODS = _services()


# -- strategies from descriptors -------------------------------------------------------------


@dataclass
class Known:
    """Names that exist in the cluster under test: strings are drawn from them often, so
    that requests get past the name checks into the deeper validation."""

    strings: list[str]
    #: ids that exist (an open transaction, a lease) and the pchannels' terms
    ints: list[int]


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
}


def _ints(low: int, high: int, known: Known) -> st.SearchStrategy[int]:
    edges = {v for v in (0, 1, 2, 3, -1, low, high, low + 1, high - 1) if low <= v <= high}
    edges.update(v for v in known.ints if low <= v <= high)
    return st.one_of(st.sampled_from(sorted(edges)), st.integers(0, 100), st.integers(low, high))


def _scalar(
    field: FieldDescriptor, known: Known, *, small: bool = False
) -> st.SearchStrategy[object]:
    """Values of a scalar field; `small` ones for the elements of huge collections."""
    kind = field.type
    if small and kind == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(known.strings), st.text(max_size=8))
    if small and kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=8)
    if kind in _INT_RANGES:
        return _ints(*_INT_RANGES[kind], known)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if kind == FieldDescriptor.TYPE_STRING:
        return st.one_of(
            # Twice: names that exist get past the name checks into deeper validation.
            st.sampled_from(known.strings),
            st.sampled_from(known.strings),
            st.text(max_size=24),
            st.text(min_size=200, max_size=2000),
            st.sampled_from(["", " ", "\x00", "a/../b", "é" * 300, "x" * 70_000]),
        )
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.one_of(
            st.binary(max_size=64),
            st.sampled_from([b"", b"\x00" * 72, b"\xff" * 4096, os.urandom(1 << 20)]),
        )
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-3, 1000))
    raise AssertionError(f"unhandled field type {kind} of {field.full_name}")


def _is_map(field: FieldDescriptor) -> bool:
    return (
        field.type == FieldDescriptor.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
        and field.is_repeated
    )


def _value(
    field: FieldDescriptor, known: Known, depth: int, *, small: bool = False
) -> st.SearchStrategy[object]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, known, depth + 1, small=small)
    return _scalar(field, known, small=small)


def messages(
    descriptor: Descriptor, known: Known, depth: int = 0, *, small: bool = False
) -> st.SearchStrategy[object]:
    """Instances of the message `descriptor` with a random subset of fields set (`small`:
    short values only, for the elements of huge collections)."""
    cls = message_factory.GetMessageClass(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> object:
        message = cls()
        for field in descriptor.fields:
            if field.type == FieldDescriptor.TYPE_MESSAGE and depth >= 3:
                continue
            if not draw(st.booleans()):
                continue
            target = getattr(message, field.name)
            if _is_map(field):
                key_field = field.message_type.fields_by_name["key"]
                value_field = field.message_type.fields_by_name["value"]
                many = not small and draw(st.sampled_from([False, False, True]))
                entries = draw(
                    st.dictionaries(
                        _scalar(key_field, known, small=small or many),
                        _value(value_field, known, depth, small=small or many),
                        max_size=300 if many else 3,
                    )
                )
                for key, value in entries.items():
                    if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        target[key].CopyFrom(value)
                    else:
                        target[key] = value
            elif field.is_repeated:
                many = not small and draw(st.sampled_from([False, False, False, True]))
                if many:
                    # Huge repeated fields: many small elements.
                    element = _value(field, known, depth, small=True)
                    values = draw(st.lists(element, min_size=200, max_size=3000))
                else:
                    values = draw(st.lists(_value(field, known, depth, small=small), max_size=4))
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    for value in values:
                        target.add().CopyFrom(value)
                else:
                    target.extend(values)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                target.CopyFrom(draw(_value(field, known, depth, small=small)))
            else:
                setattr(message, field.name, draw(_scalar(field, known, small=small)))
        return message

    return build()


# -- calling a method generically ---------------------------------------------------------------


def _error_info(error: grpc.RpcError) -> errors_pb2.ErrorInfo | None:
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(errors_pb2.ErrorInfo.DESCRIPTOR):
            info = errors_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def check_outcome(label: str, error: grpc.RpcError | None) -> None:
    """Success, or a status with an ErrorInfo (see the module doc for the exceptions)."""
    if error is None:
        return
    code = error.code()
    if code in NO_DETAIL_OK:
        return
    info = _error_info(error)
    if info is not None:
        assert info.message, f"{label}: ErrorInfo without a message ({code.name})"
        return
    details = error.details() or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        return
    raise AssertionError(f"{label}: {code.name} without an ErrorInfo detail: {details[:300]!r}")


def call(channel: grpc.Channel, method: MethodDescriptor, requests: list[object]) -> str:
    """Call `method` with `requests` (one for a unary request), check the outcome and
    return it: OK, or the status code and the ErrorInfo code."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    serialize = request_cls.SerializeToString
    deserialize = response_cls.FromString
    label = f"{method.containing_service.name}.{method.name}"
    error: grpc.RpcError | None = None
    try:
        if not method.client_streaming and not method.server_streaming:
            stub = channel.unary_unary(path, serialize, deserialize)
            stub(requests[0], timeout=UNARY_TIMEOUT_S)
        elif not method.client_streaming:
            stub = channel.unary_stream(path, serialize, deserialize)
            _drain(stub(requests[0], timeout=STREAM_TIMEOUT_S))
        elif not method.server_streaming:
            stub = channel.stream_unary(path, serialize, deserialize)
            stub(iter(requests), timeout=UNARY_TIMEOUT_S)
        else:
            stub = channel.stream_stream(path, serialize, deserialize)
            _drain(stub(iter(requests), timeout=STREAM_TIMEOUT_S))
    except grpc.RpcError as raised:
        error = raised
    check_outcome(label, error)
    if error is None:
        return "OK"
    info = _error_info(error)
    return error.code().name + (f"/{errors_pb2.ErrorCode.Name(info.code)}" if info else "")


def _drain(stream: Iterator[object]) -> None:
    for count, _response in enumerate(stream, 1):
        if count >= MAX_STREAM_RESPONSES:
            stream.cancel()  # type: ignore[attr-defined]
            return


# -- the cluster and what the node processes hold ------------------------------------------------


@dataclass
class Fuzzed:
    cluster: dev.LocalCluster
    client: Api
    pchannels: list[str]
    known: Known
    baseline: dict[str, tuple[int, int, int]]


def _metric(port: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"metric {name} missing"
    return int(float(match.group(1)))


def resources(cluster: dev.LocalCluster) -> dict[str, tuple[int, int, int]]:
    """node id -> (open fds, threads, asyncio tasks) of its process."""
    found = {}
    for node in cluster.config.nodes:
        pid = cluster.pid(node.id)
        assert pid is not None, f"node {node.id} is not running"
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = Path(f"/proc/{pid}/status").read_text()
        threads = int(re.search(r"^Threads:\s+(\d+)$", status, re.MULTILINE).group(1))  # type: ignore[union-attr]
        found[node.id] = (fds, threads, _metric(node.metrics_port, "raftwal_asyncio_tasks"))
    return found


def _settled_resources(cluster: dev.LocalCluster) -> dict[str, tuple[int, int, int]]:
    """The lowest counts seen over a few seconds (streams of a run wind down)."""
    lowest: dict[str, tuple[int, int, int]] = {}
    for _ in range(8):
        for node_id, counts in resources(cluster).items():
            previous = lowest.get(node_id, counts)
            lowest[node_id] = tuple(min(a, b) for a, b in zip(previous, counts, strict=True))  # type: ignore[assignment]
        time.sleep(0.5)
    return lowest


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    print(f"seed {SEED}")
    directory: Path = tmp_path_factory.mktemp("fuzz")
    env = dict(os.environ)
    env["RAFTWAL_SEGMENT_MAX_BYTES"] = str(64 * 1024)
    local = dev.up(directory, 3, timeout_s=60, env=env)
    client = Api(local.endpoints)
    try:
        pchannels = setup_channels(client, "fz", VCHANNELS)
        decoys = setup_channels(client, "fd", DECOYS)
        for names, vchannels in ((pchannels, VCHANNELS), (decoys, DECOYS)):
            for vchannel, index in vchannels.items():
                wait_assigned(client, names[index])
                producer = Producer(client, names[index], f"warmup-{vchannel}")
                try:
                    assert producer.send(vchannel, [b"warm-%d" % i for i in range(20)], History())
                finally:
                    producer.close()
        status = client.status()
        _, _, decoy_address = wait_assigned(client, decoys[0])
        with grpc.insecure_channel(decoy_address) as channel:
            txn = streaming_pb2_grpc.StreamingNodeStub(channel).BeginTxn(
                wire.BeginTxnRequest(vchannel="fd_v0", keepalive_ms=600_000), timeout=scaled(10)
            )
        lease = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=3_600_000, holder="fuzz"))
        known = Known(
            ints=[txn.txn_id, lease.lease_id, *(c.term for c in status.pchannels)],
            strings=[
                *decoys,
                *DECOYS,
                *(n.node_id for n in status.nodes),
                *(n.address for n in status.nodes),
                "message",
                "insert",
                "ddl",
                "txn_begin",
                "seal",
                "rw.producer",
                "key-0",
            ],
        )
        baseline = _settled_resources(local)
        print(f"baseline (fds, threads, tasks) per node: {baseline}")
        yield Fuzzed(local, client, pchannels, known, baseline)
    finally:
        client.close()
        local.stop_all()


def _examples() -> int:
    return int(os.environ.get("RAFTWAL_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))


def _fuzz(fuzzed: Fuzzed, method: MethodDescriptor, examples: int) -> None:
    request_strategy = messages(method.input_type, fuzzed.known)
    count = st.integers(1, 3) if method.client_streaming else st.just(1)
    channels = {e: grpc.insecure_channel(e) for e in fuzzed.cluster.endpoints}

    @seed(SEED)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        endpoint=st.sampled_from(fuzzed.cluster.endpoints),
        requests=count.flatmap(lambda n: st.lists(request_strategy, min_size=n, max_size=n)),
    )
    def run(endpoint: str, requests: list[object]) -> None:
        if method.full_name == "raftwal.v1.Coordinator.CreateChannels":
            assume(requests[0].count <= MAX_CREATED_PER_REQUEST)  # type: ignore[attr-defined]
        outcome = call(channels[endpoint], method, requests)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    outcomes: dict[str, int] = {}
    try:
        run()
    finally:
        for channel in channels.values():
            channel.close()
    print(f"{method.full_name}: {sorted(outcomes.items())}")
    assert outcomes, "no request was sent"


# -- tests: every method -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method",
    [m for _, m in METHODS],
    ids=[f"{m.containing_service.name}.{m.name}" for _, m in METHODS],
)
def test_every_rpc_answers_garbage_with_an_error_info(fuzzed: Fuzzed, method) -> None:
    print(f"seed {SEED}")
    _fuzz(fuzzed, method, _examples())


@pytest.mark.slow
@pytest.mark.parametrize(
    "method",
    [m for _, m in METHODS],
    ids=[f"{m.containing_service.name}.{m.name}" for _, m in METHODS],
)
def test_every_rpc_answers_garbage_with_an_error_info_many_examples(fuzzed: Fuzzed, method) -> None:
    print(f"seed {SEED}")
    _fuzz(fuzzed, method, int(os.environ.get("RAFTWAL_FUZZ_EXAMPLES", SLOW_EXAMPLES)))


def test_methods_are_enumerated_from_the_descriptors() -> None:
    names = {f"{m.containing_service.name}.{m.name}" for _, m in METHODS}
    # A sample of each service, so that a broken enumeration cannot pass silently.
    for expected in (
        "Coordinator.CreateChannels",
        "Coordinator.KeepAlive",
        "NodeManager.Assign",
        "Cluster.Propose",
        "StreamingNode.Produce",
        "StreamingNode.ReadSegment",
        "Replication.Append",
        "Replication.Fence",
    ):
        assert expected in names
    assert len(names) >= 34


def _expect_append_error(
    replication: streaming_pb2_grpc.ReplicationStub,
    request: wire.AppendRequest,
    contains: str,
    may_mismatch: bool = False,
) -> bool:
    """`request` alone on an Append stream is answered INVALID_ARGUMENT naming `contains`
    (True), or, with `may_mismatch`, MISMATCH (False: the log moved meanwhile)."""
    (answer,) = list(replication.Append(iter([request]), timeout=scaled(5)))
    if may_mismatch and answer.status == wire.APPEND_STATUS_MISMATCH:
        return False
    assert answer.status == wire.APPEND_STATUS_ERROR, answer
    assert answer.error.code == E.INVALID_ARGUMENT, answer
    assert contains in answer.error.message, answer
    return True


# -- tests: the node is intact after the run -----------------------------------------------------


def _health(endpoint: str) -> int:
    with grpc.insecure_channel(endpoint) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=scaled(5)).status


def test_nodes_are_intact_after_the_fuzzing(fuzzed: Fuzzed) -> None:
    cluster, client = fuzzed.cluster, fuzzed.client
    # Valid policy changes the fuzzer made (frozen nodes) would hold back the failovers of
    # the tests that follow: back to the defaults.
    client.call(
        "SetBalancePolicy",
        api.SetBalancePolicyRequest(
            allow_rebalance=False, unfreeze_node_ids=[n.id for n in cluster.config.nodes]
        ),
    )
    for node in cluster.config.nodes:
        process = cluster.processes[node.id]
        assert process is not None and process.poll() is None, f"node {node.id} exited"
        assert _health(node.grpc_address) == health_pb2.HealthCheckResponse.SERVING
    converged(client, expect_members=3, timeout_s=30)
    # Nothing leaked: streams and their tasks ended with the calls. A pchannel the fuzzer
    # managed to create runs an owner and replication streams (about ten tasks a node).
    after = _settled_resources(cluster)
    created = len(client.status().pchannels) - len(fuzzed.pchannels) - len(DECOYS)
    print(f"after the run (fds, threads, tasks) per node: {after}; {created} pchannels created")
    for node_id, (fds, threads, tasks) in after.items():
        base_fds, base_threads, base_tasks = fuzzed.baseline[node_id]
        assert fds <= base_fds + 24, f"{node_id}: fds {base_fds} -> {fds}"
        assert threads <= base_threads + 8, f"{node_id}: threads {base_threads} -> {threads}"
        assert tasks <= base_tasks + 16 + 12 * created, (
            f"{node_id}: asyncio tasks {base_tasks} -> {tasks} ({created} pchannels created)"
        )
    # The channels made before the run still take writes and serve them: garbage sent to
    # the internal services (Fence, Append, Heartbeat, Propose, ...) was never applied.
    for vchannel, index in VCHANNELS.items():
        pchannel = fuzzed.pchannels[index]
        history = History()
        producer = Producer(client, pchannel, f"after-{vchannel}")
        try:
            assert producer.send(vchannel, [b"after-%d" % i for i in range(10)], history)
        finally:
            producer.close()
        entries = consume_all(client, vchannel, pchannel, expect=30)
        payloads = [e.payload for e in entries]
        assert [p for p in payloads if p.startswith(b"warm-")] == [
            b"warm-%d" % i for i in range(20)
        ]
        assert [p for p in payloads if p.startswith(b"after-")] == [
            b"after-%d" % i for i in range(10)
        ]
    status = client.status()
    addresses = {n.node_id: n.address for n in status.nodes}
    assert addresses == {n.id: n.grpc_address for n in cluster.config.nodes}


# -- tests: wrong sequences ----------------------------------------------------------------------


def _expect_error(call_it, code: int) -> errors_pb2.ErrorInfo:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as raised:
        call_it()
    info = _error_info(raised.value)
    assert info is not None, f"no ErrorInfo: {raised.value.code()} {raised.value.details()}"
    assert info.code == code, info
    assert info.message
    return info


def test_wrong_sequences_are_refused_with_an_error_info(fuzzed: Fuzzed) -> None:
    client = fuzzed.client
    pchannel = fuzzed.pchannels[0]
    _, _, address = wait_assigned(client, pchannel)
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        # AppendTxn, CommitTxn and KeepAliveTxn of a transaction never begun.
        for method, request in (
            ("AppendTxn", wire.AppendTxnRequest(vchannel="fz_v0", txn_id=12345)),
            ("CommitTxn", wire.CommitTxnRequest(vchannel="fz_v0", txn_id=12345)),
            ("KeepAliveTxn", wire.KeepAliveTxnRequest(vchannel="fz_v0", txn_id=12345)),
        ):
            _expect_error(
                lambda m=method, r=request: getattr(stub, m)(r, timeout=scaled(5)),
                E.TRANSACTION_EXPIRED,
            )
        # CommitTxn twice: the retry gets the original positions; the body is written once.
        begin = stub.BeginTxn(wire.BeginTxnRequest(vchannel="fz_v0"), timeout=scaled(5))
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="fz_v0", txn_id=begin.txn_id, messages=[wire.Message(payload=b"once")]
            ),
            timeout=scaled(5),
        )
        committed = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="fz_v0", txn_id=begin.txn_id), timeout=scaled(5)
        )
        assert len(committed.positions) == 3
        # A retried commit answers the original positions and writes nothing again.
        again = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="fz_v0", txn_id=begin.txn_id), timeout=scaled(5)
        )
        assert list(again.positions) == list(committed.positions)
        # A Produce stream goes on after an error answer: every request gets its own.
        requests = [
            wire.ProduceRequest(
                request_id=1,
                pchannel=pchannel,
                messages=[wire.Message(vchannel="no_such_v", payload=b"x")],
            ),
            wire.ProduceRequest(
                request_id=2,
                pchannel=pchannel,
                messages=[wire.Message(vchannel="fz_v0", payload=b"after-error-1")],
            ),
            wire.ProduceRequest(request_id=3, pchannel=pchannel),
            wire.ProduceRequest(
                request_id=4,
                pchannel=pchannel,
                messages=[wire.Message(vchannel="fz_v0", payload=b"after-error-2")],
            ),
        ]
        results = {r.request_id: r for r in stub.Produce(iter(requests), timeout=scaled(10))}
        assert sorted(results) == [1, 2, 3, 4]
        assert results[1].error.code == E.CHANNEL_NOT_EXIST
        assert results[3].error.code == E.INVALID_ARGUMENT
        assert not results[2].HasField("error") and not results[4].HasField("error")
        assert results[4].positions[0].lsn > results[2].positions[0].lsn
        # ReadSegment of a segment that does not exist.
        _expect_error(
            lambda: list(
                stub.ReadSegment(
                    wire.ReadSegmentRequest(pchannel=pchannel, segment_id=10**12), timeout=scaled(5)
                )
            ),
            E.NOT_FOUND,
        )
        # Consume from beyond the end: nothing is invented, the stream just waits.
        latest = stub.GetLatestTimeTick(
            wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=scaled(5)
        )
        beyond = stub.Consume(
            wire.ConsumeRequest(
                vchannel="fz_v0", policy=wire.DELIVER_POLICY_START_FROM, lsn=latest.last_lsn + 1000
            ),
            timeout=scaled(1.5),
        )
        with pytest.raises(grpc.RpcError) as raised:
            for response in beyond:
                assert not response.entries, response
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    coordinator = client.stub(client.endpoints[0])
    # Ack of a broadcast that does not exist.
    _expect_error(
        lambda: coordinator.Ack(
            api.AckRequest(broadcast_id=987654321, vchannel="fz_v0", checkpoint=1),
            timeout=scaled(5),
        ),
        E.NOT_FOUND,
    )
    # KeepAlive of a lease that was never granted: refused on the stream.
    _expect_error(
        lambda: list(
            coordinator.KeepAlive(iter([api.KeepAliveRequest(lease_id=424242)]), timeout=scaled(5))
        ),
        E.NOT_FOUND,
    )


def test_internal_services_refuse_what_the_state_never_said(fuzzed: Fuzzed) -> None:
    """Node-to-node calls carrying garbage that looks valid: known names, a term above the
    assigned one, another node's address. Each is refused with an ErrorInfo and changes
    nothing (before the fix, each of these was applied)."""
    cluster, client = fuzzed.cluster, fuzzed.client
    pchannel = fuzzed.pchannels[0]
    owner, term, owner_address = wait_assigned(client, pchannel)
    status = client.status()
    replica = next(n for n in cluster.config.nodes if n.id != owner)
    with grpc.insecure_channel(status.leader_address) as channel:
        cluster_stub = coordinator_pb2_grpc.ClusterStub(channel)
        # A heartbeat would have re-registered the node at this address: another process
        # claiming the node's id is refused (its addresses change only by a rejoin).
        _expect_error(
            lambda: cluster_stub.Heartbeat(
                api.HeartbeatRequest(node_id=replica.id, address="10.9.9.9:1", incarnation=7),
                timeout=scaled(5),
            ),
            E.ALREADY_EXISTS,
        )
        # Bytes that are no command never reach the Raft log.
        _expect_error(
            lambda: cluster_stub.Propose(
                api.ProposeRequest(command=b"\xff\x00garbage"), timeout=scaled(5)
            ),
            E.INVALID_ARGUMENT,
        )
    # The replica's data worker for the pchannel serves its Replication service.
    with grpc.insecure_channel(serving_address(status.nodes, replica.id, pchannel)) as channel:
        replication = streaming_pb2_grpc.ReplicationStub(channel)
        # A fence above the assigned term would have locked the real owner out for good.
        for bad_term, claimed_owner in ((term + 1000, owner), (term, "n-impostor")):
            _expect_error(
                lambda t=bad_term, o=claimed_owner: replication.Fence(
                    wire.FenceRequest(pchannel=pchannel, term=t, owner_node_id=o), timeout=scaled(5)
                ),
                E.UNMATCHED_CHANNEL_TERM,
            )
        (answer,) = list(
            replication.Append(
                iter(
                    [
                        wire.AppendRequest(
                            pchannel=pchannel,
                            term=term + 1000,
                            owner_node_id=owner,
                            committed_lsn=10**9,
                            request_id=1,
                        )
                    ]
                ),
                timeout=scaled(5),
            )
        )
        assert answer.status == wire.APPEND_STATUS_ERROR, answer
        assert answer.error.code == E.UNMATCHED_CHANNEL_TERM, answer
        # What a request gets wrong is INVALID_ARGUMENT with what was got and expected,
        # never INNER (the node's own trouble): a bad name, and frames that do not parse
        # sent right after the replica's last entry (so that nothing else refuses them).
        _expect_append_error(
            replication,
            wire.AppendRequest(pchannel="../up", term=term, owner_node_id=owner, request_id=2),
            "invalid pchannel",
        )
        for attempt in range(3):
            (heartbeat,) = list(
                replication.Append(
                    iter(
                        [
                            wire.AppendRequest(
                                pchannel=pchannel,
                                term=term,
                                owner_node_id=owner,
                                prev_lsn=10**9,
                                prev_term=term,
                                request_id=3,
                            )
                        ]
                    ),
                    timeout=scaled(5),
                )
            )
            assert heartbeat.status == wire.APPEND_STATUS_MISMATCH, heartbeat
            garbage = wire.AppendRequest(
                pchannel=pchannel,
                term=term,
                owner_node_id=owner,
                prev_lsn=heartbeat.last_lsn,
                prev_term=heartbeat.last_term,
                frames=b"\x00garbage, no frame",
                request_id=4,
            )
            if _expect_append_error(replication, garbage, "invalid frames", attempt < 2):
                break
        # An unknown pchannel never gets a directory.
        _expect_error(
            lambda: replication.Fetch(
                wire.FetchRequest(pchannel="fz_never_created", term=1), timeout=scaled(5)
            ),
            E.CHANNEL_NOT_EXIST,
        )
        assert not (replica.data_dir / "wal" / "fz_never_created").exists()
    with grpc.insecure_channel(owner_address) as channel:
        replication = streaming_pb2_grpc.ReplicationStub(channel)
        # Only the coordinator's appends of a pending broadcast are written.
        _expect_error(
            lambda: replication.AppendBroadcast(
                wire.AppendBroadcastRequest(
                    pchannel=pchannel, vchannel="fz_v0", broadcast_id=777, message=b"forged"
                ),
                timeout=scaled(5),
            ),
            E.INVALID_ARGUMENT,
        )
    # Nothing moved: same owner and term, the pchannel takes writes, addresses unchanged.
    assert wait_assigned(client, pchannel)[:2] == (owner, term)
    producer = Producer(client, pchannel, "internal-after")
    try:
        assert producer.send("fz_v0", [b"internal-after"], History(), budget_s=15)
    finally:
        producer.close()
    addresses = {n.node_id: n.address for n in client.status().nodes}
    assert addresses == {n.id: n.grpc_address for n in cluster.config.nodes}
    entries = consume_all(client, "fz_v0", pchannel, expect=1_000, timeout_s=5)
    assert b"forged" not in {e.payload for e in entries}


# -- tests: malformed segment files --------------------------------------------------------------


def _junk_kinds(directory: Path) -> dict[str, Callable[[Path], None]]:
    """Ways to put a malformed file named like a segment into a pchannel's directory."""

    def random_bytes(target: Path) -> None:
        (target / "00000000000999999999.seg").write_bytes(random.Random(SEED).randbytes(5000))

    def truncated_header(target: Path) -> None:
        header = encode_file_header(FileHeader(target.name, 999_999_999, 1))
        (target / "00000000000999999999.seg").write_bytes(header[:11])

    def other_pchannel(target: Path) -> None:
        scratch = directory / "scratch"
        scratch.mkdir(exist_ok=True)
        writer = SegmentWriter.create(scratch, "fz_elsewhere", 999_999_999, 1)
        writer.append([Entry(lsn=999_999_999, term=1, time_tick=1, msg_type=int(MsgType.MESSAGE))])
        sealed = writer.seal()
        os.replace(sealed.path, target / sealed.path.name)

    return {
        "random-bytes": random_bytes,
        "truncated-header": truncated_header,
        "other-pchannel": other_pchannel,
    }


def _wait_durable_on(client: Api, pchannel: str, node_id: str, lsn: int) -> None:
    """Until the owner of `pchannel` reports `lsn` durable on `node_id`."""
    deadline = time.monotonic() + scaled(20)
    positions: dict[str, int] = {}
    while time.monotonic() < deadline:
        for member in client.status().members:
            for owner in member.owners:
                if owner.pchannel == pchannel and owner.state == "serving":
                    positions = {r.node_id: r.durable_lsn for r in owner.replicas}
        if positions.get(node_id, 0) >= lsn:
            return
        time.sleep(0.2)
    raise AssertionError(f"{pchannel}: lsn {lsn} not durable on {node_id}: {positions}")


def test_malformed_segment_files_are_reported_not_fatal(fuzzed: Fuzzed, tmp_path: Path) -> None:
    cluster, client = fuzzed.cluster, fuzzed.client
    damaged, healthy = fuzzed.pchannels
    healthy_owner, _, _ = wait_assigned(client, healthy)
    damaged_owner, _, _ = wait_assigned(client, damaged)
    # The victim is a replica of the damaged pchannel (the owner of the healthy one when
    # that is another node), and holds the healthy one as owner or replica.
    victim = (
        healthy_owner
        if healthy_owner != damaged_owner
        else next(n.id for n in cluster.config.nodes if n.id != damaged_owner)
    )
    victim_dir = cluster.node(victim).data_dir / "wal" / damaged
    addresses = {n.id: n.grpc_address for n in cluster.config.nodes}
    for kind, put in _junk_kinds(tmp_path).items():
        cluster.kill(victim)
        put(victim_dir)
        log_path = cluster.directory / f"{victim}.log"
        log_offset = log_path.stat().st_size
        cluster.start_node(victim)
        # The victim's other pchannel goes on, and the victim holds every acknowledged
        # entry of it (as its owner or as a replica: the owner may have moved meanwhile).
        history = History()
        producer = Producer(client, healthy, f"healthy-{kind}")
        try:
            assert producer.send(
                "fz_v1", [b"%s-%d" % (kind.encode(), i) for i in range(5)], history
            )
        finally:
            producer.close()
        _wait_durable_on(client, healthy, victim, history.acked[-1].lsn)
        # ...the damaged pchannel still takes writes at its owner (a majority without the
        # victim's copy)...
        producer = Producer(client, damaged, f"damaged-{kind}")
        try:
            assert producer.send("fz_v0", [b"d-%s" % kind.encode()], history)
        finally:
            producer.close()
        # ...and the victim reports the damaged log, naming the file, in ClusterStatus.
        deadline = time.monotonic() + scaled(20)
        warnings: list[str] = []
        while time.monotonic() < deadline:
            warnings = [
                w
                for w in client.status(endpoint=addresses[victim]).warnings
                if damaged in w and "cannot be opened" in w
            ]
            if warnings:
                break
            time.sleep(0.3)
        assert warnings and "00000000000999999999.seg" in warnings[0], (kind, warnings)
        with open(log_path, "rb") as log_file:
            log_file.seek(log_offset)
            logged = log_file.read().decode(errors="replace")
        assert f"{damaged}: cannot open the log" in logged and "00000000000999999999.seg" in logged
        print(f"{kind}: {warnings[0][:200]}")
        # Not a crash loop: the victim's process is the one started above, still running.
        process = cluster.processes[victim]
        assert process is not None and process.poll() is None
        (victim_dir / "00000000000999999999.seg").unlink()
    cluster.kill(victim)
    cluster.start_node(victim)
    converged(client, expect_members=3, timeout_s=60)
