"""The Produce stream over the transfer port: producing without gRPC.

A producer's batches go to a pchannel's owner as `ProduceRequest` messages on one
long-lived stream per node, answered by `ProduceResult` messages matched by request id.
Over grpc.aio each message costs tens of microseconds of Python in the producer and in
the node (docs/benchmarks-history.md, "The owner's Produce path"); here the same messages go
length-prefixed over a plain TCP (or TLS) connection, as WAL replication's Append streams
do (`rpc.append_stream`, whose framing and connect this module reuses).

The producer first asks the node for a ticket with `StreamingNode.OpenProduce`, a gRPC
call checked like Produce itself (the same credentials and permission). It then connects
to the node's transfer port, sends `HELLO` and the ticket, and reads one status byte.
Before a ticket matched the node reads exactly ``len(HELLO) + TICKET_BYTES`` bytes within
`rpc.segment_transfer.HELLO_TIMEOUT_S` and nothing else: nothing a connection sends is
parsed as protobuf before that. A ticket is 32 random bytes, good for one connection and
a few seconds. A node that hands out no ticket (its port is off or at its cap, or it
predates OpenProduce), or whose port cannot be reached or refuses the ticket, gets the
Produce call instead (after a port failure, for `RETRY_PORT_AFTER_S`).

After `ACCEPTED` each direction carries frames: a 4-byte big-endian length, then one
serialized message. A length over the reader's cap ends the connection: the node's cap is
the gRPC message size limit (``grpc_max_message_bytes``, which bounds the Produce call too;
OpenProduce says it), the producer's `MAX_RESULT_BYTES`. A request frame over the node's
cap, or one that does not parse as a ProduceRequest, is answered with a last
ProduceResult whose `request_id` is 0 and whose `error` (INVALID_ARGUMENT) says what was
wrong, and the node closes the connection. The node closes a
connection that sent no frame for `IDLE_TIMEOUT_S` (the producer opens another for its
next batch), or whose answers did not drain within `rpc.append_stream.IDLE_TIMEOUT_S`;
the producer gives up on a connection whose requests did not drain within that time (a
node that stopped reading). A broken stream fails its unanswered batches as unknown
outcomes, exactly as a broken Produce call does: the producer resends them with their
sequences, and the owner answers those it already holds as duplicates.
"""

from __future__ import annotations

#: What a producer sends first, before its ticket (the protocol's name and version).
HELLO = b"RWPRODC1"
#: How long a producer waits for OpenProduce's answer.
OPEN_TIMEOUT_S = 3.0
#: After a node's port could not be reached or refused its ticket, the producer uses the
#: Produce call for that node for this long before it tries the port again.
RETRY_PORT_AFTER_S = 60.0
#: A Produce connection that sent no frame for this long is closed by the node.
IDLE_TIMEOUT_S = 120.0
#: The largest answer a producer reads: a ProduceResult of a 10,000-message batch with
#: every position spelled out is about 300 KB.
MAX_RESULT_BYTES = 4 << 20

assert len(HELLO) == 8 and IDLE_TIMEOUT_S > 0
