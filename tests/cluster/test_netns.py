"""A cluster across network namespaces (`raftwal dev up --netns`): each node on its own
non-loopback address, behind its own network stack, as on three machines. Skipped, with
the reason, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev, netns
from raftwal.cli.main import main
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, consume_all, setup_channels, wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster

REASON = netns.unavailable()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[tuple[dev.LocalCluster, Api]]:
    local = dev.up(tmp_path / "cluster", 3, timeout_s=90, in_netns=True)
    client = Api(local.endpoints)
    try:
        yield local, client
    finally:
        client.close()
        local.stop_all()
        local.remove_hosts()
        assert local.netns is not None and not local.netns.exists()


@needs_netns
def test_a_cluster_across_namespaces_survives_a_killed_owner(netns_cluster) -> None:
    local, client = netns_cluster
    status = client.status()
    hosts = {m.node_id: m.grpc_address.rsplit(":", 1)[0] for m in status.members}
    assert len(set(hosts.values())) == 3, hosts
    for host in hosts.values():
        assert not ipaddress.ip_address(host).is_loopback, hosts
    (pchannel,) = setup_channels(client, "ns", {"ns_v": 0})
    owner, term, _ = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "ns")
    history = History()
    try:
        for k in range(5):
            assert producer.send("ns_v", [b"ns-%d-%d" % (k, i) for i in range(10)], history)
        # kill -9 the owner inside its namespace; the next owner takes over at a new term.
        local.kill(owner)
        for k in range(5, 10):
            assert producer.send("ns_v", [b"ns-%d-%d" % (k, i) for i in range(10)], history)
    finally:
        producer.close()
    new_owner, new_term, _ = wait_assigned(client, pchannel)
    assert new_owner != owner and new_term > term
    entries = consume_all(client, "ns_v", pchannel, expect=len(history.acked))
    assert sorted(e.payload for e in entries) == sorted(a.payload for a in history.acked)
    assert len(history.acked) == 100


@needs_netns
def test_dev_up_and_down_with_netns_leave_nothing_behind(tmp_path: Path, capsys) -> None:
    directory = tmp_path / "dev"
    hosts = None
    try:
        assert main(["dev", "up", "--netns", "--nodes", "1", "--dir", str(directory)]) == 0
        recorded = json.loads((directory / dev.CLUSTER_FILE).read_text())
        hosts = netns.NetnsHosts.from_json(recorded["netns"])
        assert hosts.exists()
        assert main(["dev", "down", "--dir", str(directory)]) == 0
        assert not hosts.exists()
        assert "netns" not in json.loads((directory / dev.CLUSTER_FILE).read_text())
    finally:
        with contextlib.suppress(Exception):
            dev.down(directory)
        if hosts is not None:
            hosts.destroy()


def test_netns_hosts_round_trip_and_names() -> None:
    hosts = netns.NetnsHosts("a1b2c3", 42, ("n1", "n2", "n10"))
    assert netns.NetnsHosts.from_json(hosts.to_json()) == hosts
    assert hosts.address("n10") == "10.199.42.13"
    assert hosts.command("n2", ["true"]) == ["ip", "netns", "exec", "rwa1b2c3-n2", "true"]
    # Interface names must fit Linux's 15 characters.
    assert all(len(name) <= 15 for name in (hosts.bridge, hosts._veth("n10")))


@needs_netns
def test_add_node_in_a_namespace_joins_and_replaces_an_original_voter(tmp_path: Path) -> None:
    """issue 36's case: `dev up --netns`, `dev add-node --netns`, `member add` the new node,
    `member remove` an original voter: three voters again, on distinct non-loopback
    addresses, and the removed one forgotten (it stops); no other node's config rewritten
    or process restarted; every acknowledged message read back."""
    directory = tmp_path / "dev"
    cluster = dev.up(directory, 3, timeout_s=90, in_netns=True)
    client = Api(cluster.endpoints)
    try:
        config_before = (directory / dev.CONFIG_FILE).read_bytes()
        pids = {n: cluster.pid(n) for n in ("n1", "n2", "n3")}
        (pchannel,) = setup_channels(client, "nsjoin", {"nsjoin_v": 0})
        wait_assigned(client, pchannel)
        producer = Producer(client, pchannel, "nsjoin")
        history = History()
        try:
            assert producer.send("nsjoin_v", [b"a-%d" % i for i in range(10)], history)
            assert main(["dev", "add-node", "--netns", "--dir", str(directory)]) == 0
            loaded = dev.load(directory)
            n4 = loaded.node("n4")
            assert not ipaddress.ip_address(n4.host).is_loopback
            assert main(["member", "add", "n4", "--dev-dir", str(directory), "--json"]) == 0
            assert producer.send("nsjoin_v", [b"b-%d" % i for i in range(10)], history)
            assert main(["member", "remove", "n1", "--dev-dir", str(directory), "--json"]) == 0
            deadline = time.monotonic() + scaled(90)
            roles: dict[str, str] = {}
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    roles = {m.node_id: m.role for m in client.status().members if m.reachable}
                    if roles == {"n2": "voter", "n3": "voter", "n4": "voter"}:
                        break
                time.sleep(0.3)
            assert roles == {"n2": "voter", "n3": "voter", "n4": "voter"}
            removed = cluster.processes["n1"]
            assert removed is not None and removed.wait(timeout=scaled(90)) == 3
            assert producer.send("nsjoin_v", [b"c-%d" % i for i in range(10)], history)
        finally:
            producer.close()
        entries = consume_all(client, "nsjoin_v", pchannel, expect=len(history.acked))
        assert sorted(e.payload for e in entries) == sorted(a.payload for a in history.acked)
        assert (directory / dev.CONFIG_FILE).read_bytes() == config_before
        assert {n: cluster.pid(n) for n in ("n2", "n3")} == {n: pids[n] for n in ("n2", "n3")}
    finally:
        client.close()
        hosts = dev.load(directory).netns  # with n4's namespace
        dev.down(directory)
        cluster.remove_hosts()
        assert hosts is not None and not hosts.exists()
