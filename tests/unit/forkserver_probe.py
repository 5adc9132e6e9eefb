"""Run by tests/unit/test_forkserver.py in a forked child (``-m tests.unit.forkserver_probe``):
prints what the test checks, then sleeps, or exits with PROBE_EXIT."""

import os
import random
import sys
import time

print("argv", sys.argv[1:], flush=True)
print("argv0", sys.argv[0], flush=True)
print("orig_argv", sys.orig_argv, flush=True)
print("cwd", os.getcwd(), flush=True)
print("env", os.environ.get("PROBE_VALUE"), os.environ.get("PROBE_ABSENT"), flush=True)
print("session", os.getsid(0) == os.getpid(), flush=True)
print("random", random.random(), flush=True)
print("fds", sorted(int(fd) for fd in os.listdir("/proc/self/fd")), flush=True)
print("stdin", os.read(0, 10), flush=True)
if os.environ.get("PROBE_EXIT"):
    sys.exit(int(os.environ["PROBE_EXIT"]))
time.sleep(600)
