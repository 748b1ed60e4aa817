"""The gRPC surface: in-process server on port 0, real Milvus Lite, the real bundled model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from memsvc.app import build_services
from memsvc.embedding.model import Embedder
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import EN_TURNS, ZH_TURNS, make_settings

# the module's shared fixture starts once: every test of it on one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("grpc-server")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Iterator[RunningServer]:
    settings = make_settings(tmp_path_factory.mktemp("grpc"))
    running = start_server("127.0.0.1:0")
    services = build_services(settings, embedder=embedder)
    running.mark_ready(services)
    yield running
    running.stop(0)
    services.close()


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.MemoryServiceStub:
    return pb_grpc.MemoryServiceStub(channel)


def events(conv: str, texts: list[str], start: int = 0) -> list[pb.MemoryEvent]:
    return [
        pb.MemoryEvent(
            conversation_id=conv,
            turn_id=start + i,
            speaker="user" if (start + i) % 2 == 0 else "assistant",
            text=t,
            timestamp=f"2026-02-0{2 + (start + i) // 4}T10:{i:02d}:00+08:00",
            participants=["Ana", "Bot"] if conv.startswith("named") else [],
        )
        for i, t in enumerate(texts)
    ]


def ingest(
    stub: pb_grpc.MemoryServiceStub, evs: list[pb.MemoryEvent]
) -> pb.BuildIncrementalChunksResponse:
    built = stub.BuildIncrementalChunks(pb.BuildIncrementalChunksRequest(events=evs))
    up = stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
    assert not up.errors
    return built


def expect_invalid(call: object, request: object, field: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call(request)  # type: ignore[operator]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")


SERVICE = "memsvc.v1.MemoryService"


def test_health_serving_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "memsvc.v1.MemoryService"):
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    reply = next(
        iter(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
    )
    names = {s.name for s in reply.list_services_response.service}
    assert {"memsvc.v1.MemoryService", "grpc.health.v1.Health"} <= names
    # v1, which newer tools ask first, answers the same (same messages, other service name)
    v1 = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    described = next(
        iter(v1(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)])))
    )
    assert described.file_descriptor_response.file_descriptor_proto
    assert "grpc.reflection.v1.ServerReflection" in names


def test_not_serving_until_ready() -> None:
    running = start_server("127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.MemoryServiceStub(ch).EmbedChunk(pb.EmbedChunkRequest(query="x"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(0)


def test_build_upsert_search_roundtrip(stub: pb_grpc.MemoryServiceStub) -> None:
    built = ingest(stub, events("g1", ZH_TURNS))
    assert built.conversation_id == "g1" and built.turn_range.end == 5
    again = stub.BuildIncrementalChunks(
        pb.BuildIncrementalChunksRequest(events=events("g1", ZH_TURNS))
    )
    assert list(again.chunks) == []
    replay = stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
    assert replay.unchanged == len(built.chunks) and replay.upserted == 0
    res = stub.EmbedDb(
        pb.EmbedDbRequest(
            query_text="护照在哪里", filters=pb.SearchFilters(conversation_ids=["g1"])
        )
    )
    assert res.top_k == 6 and res.hits and res.mode == pb.SEARCH_MODE_HYBRID
    assert "护照" in res.hits[0].text
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True)
    assert res.hits[0].text.startswith("[上下文：2026-02-02")


def test_each_filter(stub: pb_grpc.MemoryServiceStub) -> None:
    ingest(stub, events("f1", EN_TURNS))
    ingest(stub, events("named-f2", EN_TURNS))

    def hits(**filters: object) -> list[pb.Hit]:
        req = pb.EmbedDbRequest(
            query_text="puppy hiking", top_k=20, filters=pb.SearchFilters(**filters)
        )  # type: ignore[arg-type]
        return list(stub.EmbedDb(req).hits)

    assert {h.metadata.conversation_id for h in hits(conversation_ids=["f1"])} == {"f1"}
    assert {h.metadata.conversation_id for h in hits(conversation_ids=["f1", "named-f2"])} == {
        "f1",
        "named-f2",
    }
    assert {h.metadata.conversation_id for h in hits(participants=["Ana"])} == {"named-f2"}
    assert all("user" in h.metadata.speakers for h in hits(speakers=["user"]))
    assert hits(speakers=["system"], conversation_ids=["f1"]) == []
    window = pb.TimestampRange(start="2026-02-03T00:00:00+08:00", end="2026-02-03T23:59:59+08:00")
    late = hits(conversation_ids=["f1"], timestamp_range=window)
    assert late and all(h.metadata.timestamp_range.end >= "2026-02-03" for h in late)
    early = pb.TimestampRange(end="2026-02-01T00:00:00+08:00")
    assert hits(conversation_ids=["f1"], timestamp_range=early) == []
    tag = hits(conversation_ids=["f1"])[0].metadata.intent_tag
    assert {h.metadata.intent_tag for h in hits(conversation_ids=["f1"], intent_tag=tag)} == {tag}


def test_injection_through_the_rpc(stub: pb_grpc.MemoryServiceStub) -> None:
    ingest(stub, events("victim", EN_TURNS))
    evil = '" or 1==1 or "'
    res = stub.EmbedDb(
        pb.EmbedDbRequest(query_text="puppy", filters=pb.SearchFilters(conversation_ids=[evil]))
    )
    assert list(res.hits) == []
    listed = stub.ListChunks(pb.ListChunksRequest(conversation_id=evil))
    assert list(listed.chunks) == []


def test_modes_and_mmr(stub: pb_grpc.MemoryServiceStub) -> None:
    ingest(stub, events("m1", EN_TURNS * 2))
    flt = pb.SearchFilters(conversation_ids=["m1"])
    for mode in (pb.SEARCH_MODE_DENSE, pb.SEARCH_MODE_KEYWORD, pb.SEARCH_MODE_HYBRID):
        res = stub.EmbedDb(
            pb.EmbedDbRequest(query_text="Lake Tahoe trail", mode=mode, top_k=3, filters=flt)
        )
        assert res.mode == mode and res.hits
        assert "Tahoe" in res.hits[0].text
        assert len({h.text for h in res.hits}) == len(res.hits)  # identical texts deduplicated
    plain = stub.EmbedDb(pb.EmbedDbRequest(query_text="Lake Tahoe", top_k=3, filters=flt))
    diverse = stub.EmbedDb(
        pb.EmbedDbRequest(query_text="Lake Tahoe", top_k=3, filters=flt, mmr_lambda=0.3)
    )
    assert len(diverse.hits) == 3

    def covered(r: pb.EmbedDbResponse) -> int:
        return len(
            {
                t
                for h in r.hits
                for t in range(h.metadata.turn_range.start, h.metadata.turn_range.end + 1)
            }
        )

    assert covered(diverse) >= covered(plain)


def test_explain_says_where_each_hit_came_from(stub: pb_grpc.MemoryServiceStub) -> None:
    """EmbedDbRequest.explain (issue 41): each hit's rank and score in the dense and keyword
    lists, the score it was ranked by, and the query words in its text."""
    ingest(stub, events("x1", EN_TURNS))
    flt = pb.SearchFilters(conversation_ids=["x1"])
    query = "hiking the Lake Tahoe trail"
    plain = stub.EmbedDb(pb.EmbedDbRequest(query_text=query, top_k=5, filters=flt))
    assert plain.hits and not any(h.HasField("explanation") for h in plain.hits)
    assert plain.unrelated_similarity == 0.0
    for mode in (pb.SEARCH_MODE_DENSE, pb.SEARCH_MODE_KEYWORD, pb.SEARCH_MODE_HYBRID):
        res = stub.EmbedDb(
            pb.EmbedDbRequest(query_text=query, top_k=5, filters=flt, mode=mode, explain=True)
        )
        assert res.hits
        # the model's cosine of unrelated texts, what a floor for "related" builds on (ADK's
        # adapter): all-MiniLM-L6-v2's lies near 0
        assert 0.0 < res.unrelated_similarity < 0.2
        for h in res.hits:
            why = h.explanation
            assert why.fused_score == h.score
            assert (why.dense_rank > 0) == (mode != pb.SEARCH_MODE_KEYWORD)
            if mode == pb.SEARCH_MODE_DENSE:
                assert why.dense_score == h.score and why.keyword_rank == 0
            if mode == pb.SEARCH_MODE_KEYWORD:
                assert why.keyword_score == h.score and why.keyword_rank > 0
        top = res.hits[0]
        assert "Tahoe" in top.text and "tahoe" in top.explanation.matched_terms
        assert "the" not in top.explanation.matched_terms  # too common to explain anything
        if mode == pb.SEARCH_MODE_HYBRID:
            ranks = [(h.explanation.dense_rank, h.explanation.keyword_rank) for h in res.hits]
            assert ranks[0] != (0, 0) and any(d and k for d, k in ranks)


def test_status_says_who_asks_and_running_figures(stub: pb_grpc.MemoryServiceStub) -> None:
    before = stub.GetIndexStatus(pb.GetIndexStatusRequest()).figures
    ingest(stub, events("fig1", EN_TURNS[:2]))
    stub.EmbedDb(pb.EmbedDbRequest(query_text="trail", filters=pb.SearchFilters()))
    status = stub.GetIndexStatus(pb.GetIndexStatusRequest())
    # no tokens file: every caller is an unlimited admin
    assert status.caller == pb.Caller(role="admin", authenticated=False)
    assert status.health == pb.ServerHealth(store_up=True, embedder_up=True, log_up=True)
    after = status.figures
    assert after.searches == before.searches + 1
    assert after.chunks_written > before.chunks_written
    assert len(after.search_latency_bounds_s) == len(after.search_latency_counts) > 1
    assert list(after.search_latency_bounds_s) == sorted(after.search_latency_bounds_s)
    assert after.search_latency_counts[-1] <= after.searches
    assert after.uptime_s >= before.uptime_s > 0
    named = stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=["fig1"]))
    assert named.conversations[0].last_timestamp == events("fig1", EN_TURNS[:2])[1].timestamp


def test_delete_then_search(stub: pb_grpc.MemoryServiceStub) -> None:
    ingest(stub, events("d1", EN_TURNS))
    flt = pb.SearchFilters(conversation_ids=["d1"])
    deleted = stub.LogicalDeleteBySource(pb.LogicalDeleteBySourceRequest(conversation_id="d1"))
    assert deleted.deleted == 2
    assert (
        stub.LogicalDeleteBySource(pb.LogicalDeleteBySourceRequest(conversation_id="d1")).deleted
        == 0
    )
    assert list(stub.EmbedDb(pb.EmbedDbRequest(query_text="puppy", filters=flt)).hits) == []
    flt.include_deleted = True
    assert all(
        h.metadata.deleted
        for h in stub.EmbedDb(pb.EmbedDbRequest(query_text="puppy", filters=flt)).hits
    )
    purged = stub.PurgeDeleted(pb.PurgeDeletedRequest(conversation_id="d1"))
    assert purged.chunks_purged == 2 and purged.events_purged == len(EN_TURNS)


def test_embed_rpcs(stub: pb_grpc.MemoryServiceStub) -> None:
    one = stub.EmbedChunk(pb.EmbedChunkRequest(query="where is my passport"))
    assert one.dim == 384 and len(one.vector) == 384 and one.model
    assert abs(sum(v * v for v in one.vector) - 1.0) < 1e-4
    batch = stub.EmbedBatch(pb.EmbedBatchRequest(texts=["a cat", "a dog"], is_query=False))
    assert len(batch.vectors) == 2 and batch.dim == 384
    q = stub.EmbedBatch(pb.EmbedBatchRequest(texts=["where is my passport"], is_query=True))
    assert max(abs(a - b) for a, b in zip(q.vectors[0].values, one.vector, strict=True)) < 1e-5


def test_versions_list_and_retire(stub: pb_grpc.MemoryServiceStub) -> None:
    ingest(stub, events("v1", EN_TURNS))
    v2 = stub.BuildIncrementalChunks(
        pb.BuildIncrementalChunksRequest(conversation_id="v1", chunk_version=2)
    )
    stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=v2.chunks))
    listed = stub.ListChunks(pb.ListChunksRequest(conversation_id="v1", page_size=100))
    assert {c.metadata.chunk_version for c in listed.chunks} == {1, 2}
    retired = stub.RetireChunkVersion(
        pb.RetireChunkVersionRequest(conversation_id="v1", chunk_version=1)
    )
    assert retired.retired == 2


def test_bad_inputs_name_the_field(stub: pb_grpc.MemoryServiceStub) -> None:
    ev = events("bad", EN_TURNS[:2])
    expect_invalid(stub.BuildIncrementalChunks, pb.BuildIncrementalChunksRequest(), "events")
    no_conv = pb.MemoryEvent(
        turn_id=0, speaker="user", text="x", timestamp="2026-02-02T10:00:00+08:00"
    )
    expect_invalid(
        stub.BuildIncrementalChunks,
        pb.BuildIncrementalChunksRequest(events=[no_conv]),
        "events[0].conversation_id",
    )
    two = [
        ev[0],
        pb.MemoryEvent(
            conversation_id="other", turn_id=1, speaker="user", text="y", timestamp=ev[0].timestamp
        ),
    ]
    expect_invalid(
        stub.BuildIncrementalChunks,
        pb.BuildIncrementalChunksRequest(events=two),
        "events[1].conversation_id",
    )
    dup = [ev[0], ev[0]]
    expect_invalid(
        stub.BuildIncrementalChunks,
        pb.BuildIncrementalChunksRequest(events=dup),
        "events[1].turn_id",
    )
    bad_ts = pb.MemoryEvent(
        conversation_id="bad", turn_id=0, speaker="user", text="x", timestamp="02/02/2026"
    )
    expect_invalid(
        stub.BuildIncrementalChunks,
        pb.BuildIncrementalChunksRequest(events=[bad_ts]),
        "events[0].timestamp",
    )
    expect_invalid(stub.EmbedDb, pb.EmbedDbRequest(query_text="x", top_k=101), "top_k")
    expect_invalid(stub.EmbedDb, pb.EmbedDbRequest(query_text="x", top_k=-1), "top_k")
    expect_invalid(stub.EmbedDb, pb.EmbedDbRequest(query_text="  "), "query_text")
    expect_invalid(stub.EmbedChunk, pb.EmbedChunkRequest(query=""), "query")
    bad_range = pb.SearchFilters(timestamp_range=pb.TimestampRange(start="yesterday"))
    expect_invalid(
        stub.EmbedDb,
        pb.EmbedDbRequest(query_text="x", filters=bad_range),
        "filters.timestamp_range.start",
    )
    expect_invalid(
        stub.LogicalDeleteBySource,
        pb.LogicalDeleteBySourceRequest(
            conversation_id="bad", turn_range=pb.TurnRange(start=5, end=2)
        ),
        "turn_range",
    )
    expect_invalid(stub.LogicalDeleteBySource, pb.LogicalDeleteBySourceRequest(), "conversation_id")


def test_upsert_partial_batch_over_grpc(stub: pb_grpc.MemoryServiceStub) -> None:
    built = stub.BuildIncrementalChunks(
        pb.BuildIncrementalChunksRequest(events=events("p1", EN_TURNS))
    )
    bad = pb.ChunkRecord()
    bad.CopyFrom(built.chunks[0])
    bad.metadata.turn_range.start = 9
    res = stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=[bad, *built.chunks]))
    assert res.upserted == len(built.chunks)
    assert len(res.errors) == 1 and "turn_range" in res.errors[0].message


def test_generated_stubs_match_proto(tmp_path: Path) -> None:
    from grpc_tools import protoc

    root = Path(__file__).resolve().parents[2]
    args = [
        "protoc",
        f"-I{root / 'proto'}",
        f"--python_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        str(root / "proto/memsvc/v1/memory.proto"),
    ]
    assert protoc.main(args) == 0
    for name in ("memory_pb2.py", "memory_pb2_grpc.py", "memory_pb2.pyi"):
        fresh = (tmp_path / "memsvc/v1" / name).read_text()
        assert fresh == (root / "memsvc/v1" / name).read_text(), f"{name} is stale: run make proto"
    # the HTTP surface's OpenAPI description, generated from the same proto and comments
    from memsvc.transports.http.openapi import generate

    fresh_openapi = generate(root / "proto/memsvc/v1/memory.proto", root / "proto")
    stale = "memsvc/v1/openapi.json is stale: run make proto"
    assert fresh_openapi == (root / "memsvc/v1/openapi.json").read_text(), stale
