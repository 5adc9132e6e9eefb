"""Progress of long CLI work (raftwal.cli.progress): drawn on a terminal, silent with
--json or off a terminal, and `dev.wait_ready` / `snapshot save` report their steps."""

from __future__ import annotations

import argparse
import io
import time

import pytest
from rich.console import Console

from raftwal.cli.client import CliError
from raftwal.cli.progress import Progress
from raftwal.cli.snapshot import save_snapshot


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120), out


def test_on_a_terminal_the_step_is_drawn() -> None:
    console, out = _terminal()
    with Progress("dev up", enabled=True, console=console) as progress:
        progress.update("starting n2")
        time.sleep(0.3)
    assert "dev up: starting n2" in out.getvalue()


def test_off_it_draws_nothing() -> None:
    console, out = _terminal()
    with Progress("dev up", enabled=False, console=console) as progress:
        progress.update("starting n2")
    assert out.getvalue() == ""


def test_json_or_a_pipe_turns_it_off() -> None:
    assert not Progress.for_args("x", argparse.Namespace(json=True)).enabled
    # Under pytest stderr is captured, not a terminal.
    assert not Progress.for_args("x", argparse.Namespace(json=False)).enabled
    assert not Progress.for_args("x", argparse.Namespace()).enabled


def test_snapshot_save_reports_each_node_it_asks() -> None:
    steps: list[str] = []

    def channel_of(endpoint: str):  # type: ignore[no-untyped-def]
        import grpc

        return grpc.insecure_channel(endpoint)

    # Nothing listens on these ports: every attempt fails fast and the next is reported.
    with pytest.raises(CliError, match="no snapshot within"):
        save_snapshot(["127.0.0.1:1", "127.0.0.1:2"], channel_of, 1.5, steps.append)
    assert steps[0] == "asking 127.0.0.1:1"
    assert any(s.startswith("asking 127.0.0.1:2 (last: 127.0.0.1:1") for s in steps)
