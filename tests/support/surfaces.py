"""What the tests at the process edge share (tests/integration/test_tokens_and_tenants.py,
test_disk_full, test_bulkheads, ...): an event, and the reason of a refused call."""

from __future__ import annotations

import grpc
from grpc_status import rpc_status

from memsvc.v1 import memory_pb2 as pb


def reason(err: grpc.RpcError) -> str:
    from google.rpc import error_details_pb2  # type: ignore[import-untyped]

    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


def event(conv: str, turn: int, text: str) -> pb.MemoryEvent:
    return pb.MemoryEvent(
        conversation_id=conv,
        turn_id=turn,
        speaker="user",
        text=text,
        timestamp="2026-02-02T10:00:00Z",
    )
