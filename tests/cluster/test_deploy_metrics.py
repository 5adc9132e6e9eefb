"""Every metric the Grafana dashboard (deploy/grafana/raftwal.json) and the alert rules
(deploy/prometheus/alerts.yml) name exists on a live cluster's /metrics.

A three-node cluster gets a pchannel, a vchannel, a subscription behind its producer and
a few acknowledged writes, so that the metrics born of those (write latency, subscription
lag) have samples; the names are then looked up among the samples of every node's page.
A few counters only get a sample when something goes wrong (a rejection, a refused
stream): for those the family's declaration (# TYPE) on the page is enough.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from rpc.streaming_client import Producer, StreamingClient
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "raftwal.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
SCRAPE_TIMEOUT_S = scaled(5.0)
# Scraped by Prometheus itself, not served by a node.
PROMETHEUS_OWN = {"up"}
# Counters that get a sample only once the event happens; their declaration must be there.
EVENT_ONLY = {
    "raftwal_proposal_rejections_total",
    "raftwal_proposal_failures_total",
    "raftwal_stream_refusals_total",
    # Only while a replication target is configured (raftwal replicate), and those below
    # only on the node running a replicator.
    "raftwal_replicate_lag_entries",
    "raftwal_replicate_source_gap",
    "raftwal_replicate_lag_seconds",
    "raftwal_replicate_keeping_up",
    "raftwal_replicate_applied_entries_total",
    "raftwal_replicate_checkpoint_mismatch",
}
METRIC_NAME = re.compile(r"\b(raftwal_[a-z0-9_]+|up)\b(?!\s*\()")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    with running_cluster(tmp_path_factory.mktemp("deploy_metrics"), settings) as running:
        yield running


def named_in_dashboard() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            names |= set(METRIC_NAME.findall(target["expr"]))
    for variable in dashboard["templating"]["list"]:
        names |= set(METRIC_NAME.findall(str(variable.get("query", ""))))
    return names


def named_in_rules() -> set[str]:
    names: set[str] = set()
    for line in RULES.read_text().splitlines():
        if line.strip().startswith("expr:"):
            names |= set(METRIC_NAME.findall(line))
    return names


def scrape_names(port: int) -> tuple[set[str], set[str], dict[str, float]]:
    """(sample names, declared family names incl. their _total forms, and the subscription
    lag samples by pchannel) of a page."""
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S
    ) as response:
        text = response.read().decode()
    samples: set[str] = set()
    declared: set[str] = set()
    lags: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        declared.add(family.name)
        if family.type == "counter":
            declared.add(family.name + "_total")
        samples |= {s.name for s in family.samples}
        for sample in family.samples:
            if sample.name == "raftwal_subscription_lag_entries":
                lags[sample.labels["subscription"] + "/" + sample.labels["pchannel"]] = sample.value
    return samples, declared, lags


def test_the_names_are_found_in_the_files() -> None:
    """The extraction itself: a name known to be in each file is found."""
    assert "raftwal_raft_term" in named_in_dashboard()
    assert "raftwal_raft_has_leader" in named_in_rules()
    assert "raftwal_pchannel_under_replicated" in named_in_rules()
    assert "histogram_quantile" not in named_in_dashboard()


def test_every_metric_of_the_dashboard_and_rules_is_on_a_live_node(env) -> None:
    cluster, client = env
    (pchannel,) = setup_channels(client, "deploy", {"deploy_v": 0})
    wait_assigned(client, pchannel)

    async def traffic() -> None:
        async with StreamingClient(cluster.endpoints) as streaming:
            await streaming.coordinator.create_subscription("dash", ["deploy_v"])
            async with Producer(streaming, retry_timeout_s=60.0) as producer:
                for index in range(20):
                    await producer.send("deploy_v", b"m%02d" % index)

    asyncio.run(traffic())
    samples: set[str] = set()
    declared: set[str] = set()
    lags: dict[str, float] = {}
    for node in cluster.config.nodes:
        got_samples, got_declared, got_lags = scrape_names(cluster.node(node.id).metrics_port)
        samples |= got_samples
        declared |= got_declared
        lags.update(got_lags)
    # Nothing consumed yet: the subscription is behind by every entry (20 messages plus
    # the pchannel's term-start entry), reported by the owner.
    assert lags.get(f"dash/{pchannel}", 0) >= 20, lags
    wanted = (named_in_dashboard() | named_in_rules()) - PROMETHEUS_OWN
    missing = sorted(n for n in wanted if n not in samples and n not in EVENT_ONLY)
    assert not missing, f"named in deploy/ but without a sample on any node: {missing}"
    undeclared = sorted(n for n in wanted & EVENT_ONLY if n not in declared)
    assert not undeclared, f"named in deploy/ but not declared on any node: {undeclared}"


def _handled(port: int, method: str, code: str) -> float:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S
    ) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "raftwal_grpc_server_handled_total" and sample.labels == {
                "method": method,
                "code": code,
            }:
                return sample.value
    return 0.0


def test_grpc_answers_are_counted_by_method_and_code(env) -> None:
    """raftwal_grpc_server_handled_total counts each answer of the node that gave it:
    OK, a servicer's error code, and a stream the client cancelled."""
    cluster, _ = env
    node = cluster.config.nodes[0]
    port = cluster.node(node.id).metrics_port
    describe = "/raftwal.v1.Coordinator/DescribeChannels"
    watch = "/raftwal.v1.Coordinator/WatchEvents"
    before = {
        code: _handled(port, describe, code) for code in ("OK", "NOT_FOUND", "INVALID_ARGUMENT")
    }
    with grpc.insecure_channel(node.grpc_address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        stub.DescribeChannels(api.DescribeChannelsRequest(), timeout=30)
        with pytest.raises(grpc.RpcError) as failed:
            stub.DescribeChannels(api.DescribeChannelsRequest(pchannels=["no_such"]), timeout=30)
        code = failed.value.code().name
        assert code in before, code
        cancelled_before = _handled(port, watch, "CANCELLED")
        stream = stub.WatchEvents(api.WatchEventsRequest(), timeout=60)
        next(stream)  # the first response: the servicer runs, then the client goes away
        stream.cancel()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (
            _handled(port, describe, "OK") >= before["OK"] + 1
            and _handled(port, describe, code) >= before[code] + 1
            and _handled(port, watch, "CANCELLED") >= cancelled_before + 1
        ):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"not counted: OK {_handled(port, describe, 'OK')} (was {before['OK']}), {code} "
        f"{_handled(port, describe, code)} (was {before[code]}), CANCELLED "
        f"{_handled(port, watch, 'CANCELLED')} (was {cancelled_before})"
    )
