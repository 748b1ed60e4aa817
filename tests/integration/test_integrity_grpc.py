"""Issue 10's races as callers meet them: through the public RPCs, on a real server with
its background worker, with the timings of the original reports."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from memsvc.app import Services
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import turn
from tests.support.conversations import generate
from tests.support.launch import list_all_chunks

SECRET = "My bank password is hunter2."


@pytest.fixture()
def stub(services: Services) -> Iterator[pb_grpc.MemoryServiceStub]:
    running: RunningServer = start_server("127.0.0.1:0")
    running.mark_ready(services)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield pb_grpc.MemoryServiceStub(channel)
    running.stop(0)


def found(stub: pb_grpc.MemoryServiceStub, conv: str, query: str) -> list[str]:
    """Texts every search mode returns for `query` within `conv`."""
    texts = []
    for mode in (pb.SEARCH_MODE_HYBRID, pb.SEARCH_MODE_DENSE, pb.SEARCH_MODE_KEYWORD):
        reply = stub.EmbedDb(
            pb.EmbedDbRequest(
                query_text=query,
                top_k=50,
                mode=mode,
                filters=pb.SearchFilters(conversation_ids=[conv]),
            )
        )
        texts += [h.text for h in reply.hits]
    return texts


def test_whole_delete_during_async_indexing_stays_deleted(
    stub: pb_grpc.MemoryServiceStub,
) -> None:
    """Defect 1a: the delete lands 30-300 ms after the append, while the worker embeds."""
    for n, delay in enumerate((0.03, 0.08, 0.15, 0.3)):
        conv = f"race-del-{n}"
        events = [
            event_to_pb(e) for e in generate(conv, 20 + n, sessions=3, turns_per_session=(10, 10))
        ]
        events[0].text = SECRET
        stub.AppendEvents(pb.AppendEventsRequest(events=events))
        time.sleep(delay)
        stub.LogicalDeleteBySource(pb.LogicalDeleteBySourceRequest(conversation_id=conv))
        waited = stub.WaitForIndexed(
            pb.WaitForIndexedRequest(
                conversation_id=conv, turn_id=len(events) - 1, timeout_ms=120_000
            )
        )
        # the delete is in the store (the worker may still be ending a now-stale step,
        # whose writes are refused)
        assert waited.indexed, waited.status
        assert list_all_chunks(stub, conv) == []
        assert not any("hunter2" in t for t in found(stub, conv, "bank password hunter2"))
        stub.PurgeDeleted(pb.PurgeDeletedRequest(conversation_id=conv))
        assert not any("hunter2" in t for t in found(stub, conv, "bank password hunter2"))


def test_concurrent_build_and_upsert_clients_converge(
    stub: pb_grpc.MemoryServiceStub, services: Services
) -> None:
    """Defect 6 over gRPC: four clients build overlapping slices and upsert what they got,
    in any interleaving; the stored chunks equal one clean build of the same turns."""
    conv = "race-build"
    events = [
        event_to_pb(turn(conv, i, f"Turn {i}: the ferry to island number {i} leaves at noon."))
        for i in range(30)
    ]
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            for start in range(k, 30, 4):
                built = stub.BuildIncrementalChunks(
                    pb.BuildIncrementalChunksRequest(
                        events=events[max(0, start - 3) : start + 1], allow_gaps=True
                    )
                )
                time.sleep(0.005 * k)  # let other clients build in between
                reply = stub.UpsertVectorRecords(
                    pb.UpsertVectorRecordsRequest(records=built.chunks)
                )
                # refusals are only ever "someone else's build is newer"
                assert {e.reason for e in reply.errors} <= {"superseded", "mismatch"}
        except BaseException as exc:  # a failed assertion in a thread must reach the test
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    pending = stub.BuildIncrementalChunks(pb.BuildIncrementalChunksRequest(conversation_id=conv))
    stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=pending.chunks))
    got = sorted(c.text for c in list_all_chunks(stub, conv))

    ref = [turn("race-ref", i, e.text) for i, e in enumerate(events)]
    built = services.ingest.build(ref)
    services.ingest.upsert(built.chunks)
    want = sorted(
        c.text.replace("race-ref", conv)
        for c in services.ingest.list_chunks("race-ref", False, 1000, "").chunks
    )
    assert got == want
    assert len(got) >= 2
