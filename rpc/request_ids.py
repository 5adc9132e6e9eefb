"""Request ids for raw-stub callers: one id per logical write, reused on every retry.

The SDK (`rpc.coordinator_client`) gives every mutating call a request id and keeps it
across its retries; the node's deduplication window then answers a retry whose first
attempt committed with the stored result instead of applying it twice (or refusing it:
a retried CreateVChannel would otherwise fail with ALREADY_EXISTS). Tools that call the
generated stubs directly (the demo, benchmarks, test clients) must do the same: stamp the
request once per logical call with `with_request_id`, before their retry loop, never
inside it.

Must never: give a request that already carries an id a new one (a caller's own id is a
promise to the server), or touch a request without a `request_id` field (reads).
"""

from __future__ import annotations

import uuid
from typing import TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)

REQUEST_ID_FIELD = "request_id"


def is_write(request: Message) -> bool:
    """Whether `request` is a write the node deduplicates by request id (its message has a
    string `request_id` field)."""
    field = request.DESCRIPTOR.fields_by_name.get(REQUEST_ID_FIELD)
    return field is not None and field.type == field.TYPE_STRING


def with_request_id(request: M) -> M:
    """`request` itself if it is a read or carries an id already, else a copy with a fresh
    request id (uuid4 hex). Call it once per logical call, before the first attempt, and
    send what it returns on every retry. The caller's object is never changed: a caller
    that sends the same message again later makes a new logical call (the demo sends one
    BroadcastRequest before and after an unlock), which must not be answered with the
    first call's stored result."""
    if not is_write(request) or getattr(request, REQUEST_ID_FIELD):
        return request
    stamped = type(request)()
    stamped.CopyFrom(request)
    setattr(stamped, REQUEST_ID_FIELD, uuid.uuid4().hex)
    return stamped
