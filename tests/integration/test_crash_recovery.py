"""Fault injection (issue 24): kill -9 of the server at random instants of a large delete,
a purge and a reindex; after each restart no deleted turn is findable, every live turn is,
and at the end the store equals a rebuild of it from the log."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from pathlib import Path

import grpc

from memsvc.app import Services, build_services
from memsvc.domain.types import MemoryEvent, SearchFilters, SearchMode, SearchRequest
from memsvc.embedding.model import Embedder
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import make_settings
from tests.support.conversations import generate
from tests.support.launch import free_port, start_child, wait_serving
from tests.support.waiting import until_idle

CONV = "crashy"


def marker(turn_id: int) -> str:
    return f"zq{turn_id}qz"


def events() -> list[MemoryEvent]:
    """~300 turns, each carrying a marker no other turn's text contains."""
    out = generate(CONV, 7, sessions=12, turns_per_session=(22, 28))
    return [e.__class__(**{**e.__dict__, "text": f"{e.text} {marker(e.turn_id)}"}) for e in out]


def searched(svc: Services) -> dict[str, str]:
    """The live chunks of the searched version (what a rebuild from the log restores)."""
    with svc.log.snapshot() as log:
        active = log.conversation(CONV).active_version  # type: ignore[union-attr]
    chunks = svc.ingest.list_chunks(CONV, False, 1000, "", active).chunks
    return {c.chunk_id: c.text for c in chunks}


def check(svc: Services) -> None:
    """After recovery: no deleted turn's text is stored live or found in any mode, and
    every live turn is covered by a live chunk of the searched version."""
    until_idle(svc, CONV, timeout_s=300)
    with svc.log.snapshot() as log:
        deleted = log.deleted_turn_ids(CONV)
        live_turns = {t.turn_id for t in log.live_turns(CONV)}
        active = log.conversation(CONV).active_version  # type: ignore[union-attr]
    chunks = svc.ingest.list_chunks(CONV, False, 1000, "").chunks
    texts = "\n".join(c.text for c in chunks)
    assert not [t for t in deleted if marker(t) in texts], "deleted text stored live"
    covered = {
        t
        for c in chunks
        if c.metadata.chunk_version == active
        for t in range(c.metadata.turn_range.start, c.metadata.turn_range.end + 1)
    }
    assert live_turns <= covered, sorted(live_turns - covered)[:10]
    if deleted:
        query = " ".join(marker(t) for t in deleted[:12])
        for mode in SearchMode:
            hits = svc.search.search(SearchRequest(query, 50, SearchFilters((CONV,)), mode)).hits
            assert not [t for t in deleted if any(marker(t) in h.text for h in hits)], mode


def crash_during(
    data: Path, call: str, request: object, within_s: float, rng: random.Random
) -> bool:
    """Start the server, send the call, kill -9 the server at a random instant in its first
    `within_s` seconds. Returns whether the call was still running when killed."""
    port = free_port()
    proc = start_child(data, port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
            stub = pb_grpc.MemoryServiceStub(channel)
            done = threading.Event()

            def send() -> None:
                with contextlib.suppress(grpc.RpcError):  # the server dies under it
                    getattr(stub, call)(request, timeout=120)
                done.set()

            threading.Thread(target=send, daemon=True).start()
            time.sleep(rng.uniform(0.0, within_s))
            interrupted = not done.is_set()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            done.wait(30)
            return interrupted
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_kill_at_random_instants_of_delete_purge_and_reindex(
    tmp_path: Path, embedder: Embedder
) -> None:
    rng = random.Random(2024)
    data = tmp_path / "data"
    svc = build_services(make_settings(data), embedder=embedder)
    try:
        svc.ingest.append(events())
        svc.worker.notify()
        until_idle(svc, CONV, timeout_s=600)
        last = svc.queue.status([CONV])[0].last_appended_turn
    finally:
        svc.close()
    # (call, request, seconds of it the kill falls in): the synchronous calls are killed
    # while they run; a Reindex returns at once and the kill lands in the worker's rebuild.
    steps: list[tuple[str, object, float]] = []
    for _ in range(2):
        start = rng.randrange(0, last - 60)
        span = pb.TurnRange(start=start, end=start + rng.randrange(20, 60))
        request = pb.LogicalDeleteBySourceRequest(conversation_id=CONV, turn_range=span)
        steps.append(("LogicalDeleteBySource", request, 0.25))
    steps.append(("PurgeDeleted", pb.PurgeDeletedRequest(conversation_id=CONV), 0.1))
    steps.append(("Reindex", pb.ReindexRequest(conversation_ids=[CONV], chunk_version=2), 1.5))
    interrupted = 0
    for call, request, within_s in steps:
        interrupted += crash_during(data, call, request, within_s, rng)
        svc = build_services(make_settings(data), embedder=embedder)
        try:
            check(svc)
        finally:
            svc.close()
    assert interrupted >= 2, "the kills should land inside the synchronous calls"
    # The projection rebuilt from the log (a new collection) equals the store it replaces.
    svc = build_services(make_settings(data), embedder=embedder)
    try:
        until_idle(svc, CONV, timeout_s=300)
        before = searched(svc)
    finally:
        svc.close()
    rebuilt = build_services(make_settings(data, collection="rebuilt"), embedder=embedder)
    try:
        until_idle(rebuilt, CONV, timeout_s=300)
        check(rebuilt)
        after = searched(rebuilt)
    finally:
        rebuilt.close()
    assert after == before
