"""Progress for CLI work that can take seconds: one transient line on stderr with a
spinner, what is being waited for, and the time spent.

Shown only on a terminal and never with ``--json``: in a pipe, a log or a script every
call is a no-op, so machine-readable output stays exactly what it was. The line is
transient (rich removes it when the work ends), so a terminal shows the result alone.
This module only draws; it never decides anything, and it must not raise into the work
it reports on.
"""

from __future__ import annotations

import argparse
import sys
from types import TracebackType

from rich.console import Console
from rich.progress import Progress as RichProgress
from rich.progress import SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn


class Progress:
    """``with Progress(title, enabled=...) as progress: ... progress.update("step")``."""

    def __init__(self, title: str, *, enabled: bool, console: Console | None = None) -> None:
        self.title = title
        self.enabled = enabled
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._console = console

    @classmethod
    def for_args(cls, title: str, args: argparse.Namespace) -> Progress:
        """On when stderr is a terminal and the command was not asked for --json."""
        return cls(title, enabled=not getattr(args, "json", False) and sys.stderr.isatty())

    def __enter__(self) -> Progress:
        if self.enabled:
            self._bar = RichProgress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self._console or Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.title, total=None)
        return self

    def update(self, step: str) -> None:
        """Say what is being done or waited for now (a no-op when off)."""
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=f"{self.title}: {step}")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


__all__ = ["Progress"]
