"""What pysyncobj's framing costs per Raft message in a node process: pickle, zlib level 3
and Fernet (the cluster secret's encryption), for a one-command AppendEntries and its
answer. The node's modules are imported first: zlib's cost depends on the allocator's
state, and a fresh interpreter pays several times more per call than a node does.

    PYTHONPATH=. .venv/bin/python bench/raft_framing.py
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
import zlib

from cryptography.fernet import Fernet

import raftwal.node.process  # noqa: F401 (the node's imports, for the allocator's state)
from rpc.protos import coordination_pb2 as pb


def per_call_us(function: object, count: int = 20_000) -> float:
    begin = time.perf_counter()
    for _ in range(count):
        function()  # type: ignore[operator]
    return (time.perf_counter() - begin) / count * 1e6


def report(name: str, message: dict[str, object], fernet: Fernet) -> None:
    pickled = pickle.dumps(message)
    packed = zlib.compress(pickled, 3)
    token = fernet.encrypt_at_time(packed, 1000)
    print(f"{name}: {len(pickled)} B pickled, {len(token)} B on the wire")
    steps = {
        "pickle": lambda: pickle.dumps(message),
        "zlib level 3": lambda: zlib.compress(pickled, 3),
        "Fernet encrypt": lambda: fernet.encrypt_at_time(packed, 1000),
        "Fernet decrypt": lambda: fernet.decrypt_at_time(token, 10**9, 1000),
        "zlib inflate": lambda: zlib.decompress(packed),
        "unpickle": lambda: pickle.loads(pickled),
    }
    for step, function in steps.items():
        print(f"  {step:15s} {per_call_us(function):6.1f} us")


def main() -> int:
    fernet = Fernet(Fernet.generate_key())
    command = pb.Command(request_id=uuid.uuid4().hex).SerializeToString() + os.urandom(120)
    entry = (b"\x00" + pickle.dumps((1, (command,))), 12345, 7)
    messages = {
        "AppendEntries, 1 command": {
            "type": "append_entries",
            "term": 7,
            "commit_index": 12344,
            "entries": [entry],
            "prevLogIdx": 12344,
            "prevLogTerm": 7,
        },
        "answer": {"type": "next_node_idx", "next_node_idx": 12346, "success": True},
    }
    for name, message in messages.items():
        report(name, message, fernet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
