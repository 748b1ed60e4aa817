"""memsvc's Python client: `MemoryClient` (a thin typed wrapper with the token, TLS and
retries) and the generated stubs in `memsvc_client.v1` for everything else.

    from memsvc_client import MemoryClient, pb

    with MemoryClient("127.0.0.1:50051", token=...) as memory:
        memory.append([pb.MemoryEvent(...)], wait=True)
        hits = memory.search("what is the dog called?", conversation_ids=["c1"])
"""

from memsvc_client.client import MemoryClient, MemsvcError
from memsvc_client.v1 import memory_pb2 as pb

__all__ = ["MemoryClient", "MemsvcError", "pb"]
