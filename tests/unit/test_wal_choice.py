"""The WAL implementation of a pchannel in the coordination state: chosen at creation
(CreatePChannels.wal, wal_config), validated and bounded by the state machine, and kept in
the pchannel (every node reads it there)."""

from __future__ import annotations

import pytest

from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2 as E
from statemachine import apply_command
from statemachine.state import new_state
from tests.unit.helpers import create_pchannels


def run(state: pb.CoordinationState, command: pb.Command) -> pb.CommandResult:
    return apply_command(state, command.SerializeToString(), state.last_raft_index + 1)


def test_the_implementation_is_recorded_with_its_config():
    state = new_state()
    result = run(
        state,
        create_pchannels("pj", wal="jetstream", wal_config={"url": "nats://127.0.0.1:4222"}),
    )
    assert result.rejection.code == E.OK, result.rejection.message
    channel = state.pchannels["pj"]
    assert channel.wal == "jetstream" and dict(channel.wal_config) == {
        "url": "nats://127.0.0.1:4222"
    }
    # "segments" is the default and is recorded as ""
    assert run(state, create_pchannels("ps", wal="segments")).rejection.code == E.OK
    assert state.pchannels["ps"].wal == ""
    assert run(state, create_pchannels("pl", wal="local")).rejection.code == E.OK
    assert state.pchannels["pl"].wal == "local"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"wal": "kafka"}, "invalid wal ('kafka'; expected one of segments, local, jetstream)"),
        ({"wal": "local", "wal_config": {"a": "b"}}, "expected none for local"),
        ({"wal_config": {"a": "b"}}, "expected none for segments"),
        (
            {"wal": "jetstream", "wal_config": {f"k{i}": "v" for i in range(17)}},
            "17 keys; expected at most 16",
        ),
        ({"wal": "jetstream", "wal_config": {"url": "x" * 2000}}, "at most 1024 chars"),
    ],
)
def test_a_bad_implementation_or_config_is_rejected(fields, message):
    state = new_state()
    result = run(state, create_pchannels("p", **fields))
    rejection = result.rejection
    assert rejection.code == E.INVALID_ARGUMENT and message in rejection.message, rejection.message
    assert "p" not in state.pchannels
