"""A TCP proxy per directed link between `peer_main.py` processes, for partition tests.

Lives here: `RaftNet`, which runs the chaos suite's link proxies (raftwal/chaos/net.py
`_LinkProxy`: open, reset or drop, healing resumes where a drop stopped) on a thread of
its own, keyed by peer address instead of node config. A peer dials each partner through
the proxy of its own link (`dial_table`); pysyncobj keeps one connection per pair, dialled
by one side, so cutting both directed links of a pair cuts the pair.

Must never: listen on or forward to anything but 127.0.0.1, or wait without a bound.
"""

from __future__ import annotations

import asyncio
import threading

from raft_harness import free_ports

from raftwal.chaos.net import CONTROL_TIMEOUT_S, Link, _LinkProxy


class RaftNet:
    def __init__(self, addresses: list[str]) -> None:
        links = [Link(a, b, "raft") for a in addresses for b in addresses if a != b]
        self._ports = dict(zip(links, free_ports(len(links)), strict=True))
        self._proxies: dict[Link, _LinkProxy] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="raft-net", daemon=True)
        self._started = threading.Event()

    def dial_table(self, source: str) -> dict[str, str]:
        """Where `source` dials each partner: its own proxy of that link."""
        return {
            link.target: f"127.0.0.1:{port}"
            for link, port in self._ports.items()
            if link.source == source
        }

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(CONTROL_TIMEOUT_S):
            raise TimeoutError(f"proxies not listening after {CONTROL_TIMEOUT_S} s")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start_all() -> None:
            for link, port in self._ports.items():
                upstream = int(link.target.rsplit(":", 1)[1])
                proxy = _LinkProxy(link, port, upstream)
                await proxy.start()
                self._proxies[link] = proxy

        self._loop.run_until_complete(start_all())
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            for proxy in self._proxies.values():
                self._loop.run_until_complete(proxy.close())
            self._loop.close()

    def _call(self, function: object) -> None:
        async def run() -> None:
            function()  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(CONTROL_TIMEOUT_S)

    def isolate(self, address: str, mode: str = "drop") -> None:
        """Cut every link to and from `address`."""

        def apply() -> None:
            for link, proxy in self._proxies.items():
                if address in (link.source, link.target):
                    proxy.cut(mode)

        self._call(apply)

    def cut(self, a: str, b: str, mode: str = "drop") -> None:
        """Cut both links between `a` and `b`."""

        def apply() -> None:
            for link, proxy in self._proxies.items():
                if {link.source, link.target} == {a, b}:
                    proxy.cut(mode)

        self._call(apply)

    def heal_all(self) -> None:
        def apply() -> None:
            for proxy in self._proxies.values():
                proxy.heal()

        self._call(apply)

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CONTROL_TIMEOUT_S)
