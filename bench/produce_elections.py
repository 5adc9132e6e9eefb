"""Raft elections under the WAL's maximum produce load (issue 35, item 3).

A three-node dev cluster (fsync policy `always`, as `bench/wal.py` runs it) takes
`bench/wal.py`'s produce phase for `--duration-s` (60): `--producers` (8) producers of
100-byte messages, `--small-batch` (100) messages per batch, `--in-flight` (8) batches
outstanding each, back to back. Once a second every node's Prometheus endpoint is read
(`raftwal_raft_term`, `raftwal_raft_is_leader`), outside the nodes' gRPC path.

Reports: the Raft term (highest over the nodes) before the load and after it, leader
changes seen in the samples, samples where no node said it leads, the pchannel terms
(`raftwal_wal_owner_term`, highest over the nodes: each rise is an owner change, a
failover that every writer of the pchannel pays for) and the load's msgs/s. Nothing under
this load should cost the leader its leadership, or an owner its pchannel.

    .venv/bin/python bench/produce_elections.py [--duration-s 60] [--json] [--keep-dir DIR]

Every process it starts is stopped by its pid (`LocalCluster.stop_all`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wal import SIZES, RaftwalWal, close_all, pipelined_load  # noqa: E402

SAMPLE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 0.8
_GAUGE = re.compile(r"^(raftwal_raft_term|raftwal_raft_is_leader) ([0-9.e+]+)$", re.M)
_OWNER_TERM = re.compile(r'^raftwal_wal_owner_term\{pchannel="([^"]+)"\} ([0-9.e+]+)$', re.M)


def scrape(address: str) -> tuple[int, bool, dict[str, int]] | None:
    """(term, is_leader, owner term by pchannel) from one node's /metrics, or None when it
    does not answer in time."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    values = {name: float(value) for name, value in _GAUGE.findall(text)}
    if "raftwal_raft_term" not in values:
        return None
    owner_terms = {name: int(float(value)) for name, value in _OWNER_TERM.findall(text)}
    return (
        int(values["raftwal_raft_term"]),
        values.get("raftwal_raft_is_leader", 0.0) == 1.0,
        owner_terms,
    )


class Sampler:
    """Samples every node's term and leadership once a second on a thread of its own, so
    a busy benchmark event loop cannot delay the samples."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self._addresses = addresses
        self.samples: list[tuple[float, dict[str, tuple[int, bool, dict[str, int]] | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="term-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            begin = time.monotonic()
            self.samples.append(
                (begin, {node: scrape(address) for node, address in self._addresses.items()})
            )
            self._stop.wait(max(0.0, SAMPLE_INTERVAL_S - (time.monotonic() - begin)))

    def summary(self) -> dict[str, object]:
        terms = [
            max(v[0] for v in sample.values() if v is not None)
            for _, sample in self.samples
            if any(v is not None for v in sample.values())
        ]
        leaders = [
            sorted(node for node, v in sample.items() if v is not None and v[1])
            for _, sample in self.samples
        ]
        owner_terms: list[dict[str, int]] = []
        for _, sample in self.samples:
            highest: dict[str, int] = {}
            for value in sample.values():
                for name, term in (value[2] if value is not None else {}).items():
                    highest[name] = max(term, highest.get(name, 0))
            owner_terms.append(highest)
        first_terms = next((terms for terms in owner_terms if terms), {})
        last_terms = next((terms for terms in reversed(owner_terms) if terms), {})
        changes = 0
        previous: str | None = None
        for names in leaders:
            if len(names) == 1:
                if previous is not None and names[0] != previous:
                    changes += 1
                previous = names[0]
        return {
            "samples": len(self.samples),
            "term_first": terms[0] if terms else None,
            "term_last": terms[-1] if terms else None,
            "leader_changes": changes,
            "samples_without_leader": sum(1 for names in leaders if not names),
            "pchannels_sampled": len(last_terms),
            "pchannel_term_rises": sum(
                term - first_terms.get(name, term) for name, term in last_terms.items()
            ),
            "unanswered_scrapes": sum(
                1 for _, sample in self.samples for v in sample.values() if v is None
            ),
        }


async def run(args: argparse.Namespace) -> dict[str, object]:
    payloads = {size: os.urandom(length) for size, length in SIZES.items()}
    kept = None if args.keep_dir is None else tempfile.mkdtemp(dir=args.keep_dir)
    with contextlib.nullcontext(kept) if kept else tempfile.TemporaryDirectory() as tmp:
        system = RaftwalWal(Path(tmp) / "raftwal", payloads)
        try:
            await system.start()
            addresses = {
                node.id: f"{node.host}:{node.metrics_port}" for node in system.cluster.config.nodes
            }
            sampler = Sampler(addresses)
            sampler.start()
            await asyncio.sleep(3 * SAMPLE_INTERVAL_S)  # a few samples before the load
            producers = await system.producers("small", args.producers, args.small_batch)
            try:
                load = await pipelined_load(
                    producers, args.in_flight, 1.0, args.duration_s, system.pids()
                )
            finally:
                await close_all(producers)
            await asyncio.sleep(2 * SAMPLE_INTERVAL_S)
            sampler.stop()
        finally:
            await system.stop()
    report = sampler.summary()
    report.update(
        {
            "duration_s": args.duration_s,
            "producers": args.producers,
            "batch": args.small_batch,
            "in_flight": args.in_flight,
            "msgs_per_s": round(load.msgs_per_s, 1),
            "errors": dict(load.latencies.errors),
            "load_average": os.getloadavg()[0],
        }
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--small-batch", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-dir", help="keep the nodes' data and logs under this directory")
    args = parser.parse_args(argv)
    if not 1 <= args.duration_s <= 3600:
        parser.error(f"invalid --duration-s ({args.duration_s}; expected 1..3600)")
    report = asyncio.run(run(args))
    # One line for machines, one key a line for people.
    print(json.dumps(report, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
