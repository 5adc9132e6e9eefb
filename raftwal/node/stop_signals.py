"""SIGTERM and SIGINT in a node's control process and data workers.

Both stop on either signal through their event loop (``loop.add_signal_handler``). Such a
handler has the signal's number written to the loop's self-pipe, and asyncio's ``close()``
closes that pipe *before* it removes the handlers. A signal arriving in between (the
supervisor stops the workers after the control process ended, while they are already
stopping on their own) made Python print "Exception ignored when trying to write to the
signal wakeup fd: OSError: [Errno 9] Bad file descriptor" into the node's log, after the
process's last word (its reason to exit).

``release`` ends the handlers while the loop is still whole. A worker then ignores both
signals: it is stopping already, and the supervisor kills one that outlives its grace.
The control process goes back to the default action, so that a further SIGTERM still
ends it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install(loop: asyncio.AbstractEventLoop, handler: Callable[[], object]) -> None:
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, handler)


def release(loop: asyncio.AbstractEventLoop, *, ignore: bool) -> None:
    for signum in STOP_SIGNALS:
        # Back to the default action; the last one also clears the loop's wakeup fd.
        loop.remove_signal_handler(signum)
        if ignore:
            signal.signal(signum, signal.SIG_IGN)
