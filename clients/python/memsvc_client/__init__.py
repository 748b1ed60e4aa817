"""memsvc's Python client: `MemoryClient` (a thin typed wrapper with the token, TLS and
retries), `AsyncMemoryClient` (the same over grpc.aio), the generated stubs in
`memsvc_client.v1` for everything else, and framework adapters in
`memsvc_client.integrations` (optional extras).

    from memsvc_client import MemoryClient, pb

    with MemoryClient("127.0.0.1:50051", token=...) as memory:
        memory.append([pb.MemoryEvent(...)], wait=True)
        hits = memory.search("what is the dog called?", conversation_ids=["c1"])
"""

from memsvc_client.aio import AsyncMemoryClient
from memsvc_client.client import MemoryClient, MemsvcError, RefusedEvents, new_idempotency_key
from memsvc_client.v1 import memory_pb2 as pb

__all__ = [
    "AsyncMemoryClient",
    "MemoryClient",
    "MemsvcError",
    "RefusedEvents",
    "new_idempotency_key",
    "pb",
]
