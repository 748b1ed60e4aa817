"""Shards by conversation or by tenant (`MEMSVC_STORE_SHARD_BY`): what each costs a search.

    python benchmarks/shard_placement.py [--tenants 50] [--conversations 10000] [--shards 32]

The same rows (10 a conversation, conversations `t<k>/c<n>` under `--tenants` tenants,
random 384-dimension vectors, texts of words drawn from a small vocabulary) go into two
stores of `--shards` Milvus Lite collections (memsvc.storage.milvus.store.MilvusChunkStore,
every shard loaded): one placing conversations by the hash of their id, one by their
tenant's. Then, medians of 40 calls in ms: a dense and a keyword search of one
conversation (scoped), of one tenant's prefix (a token limited to it), and of every
conversation; and the rows of the largest shard. The subject is the store: no model, no
event log (keyword weights are the query's terms, each 1.0).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from lite_filters import median_ms

from memsvc.domain import bm25
from memsvc.domain.hashing import content_hash
from memsvc.domain.ids import chunk_id
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import ChunkRecord, StoredChunk
from memsvc.domain.types import ChunkMetadata, SearchFilters, TimestampRange, TurnRange
from memsvc.ports import SearchScope
from memsvc.storage.milvus.store import MilvusChunkStore

DIM = 384
ROWS_PER_CONVERSATION = 10
WORDS = [f"w{i}" for i in range(2000)]
SEARCHES = 40  # calls a median is taken of


def rows(tenants: int, conversations: int, rng: random.Random) -> list[StoredChunk]:
    vectors = np.random.default_rng(0).standard_normal(
        (conversations * ROWS_PER_CONVERSATION, DIM), dtype=np.float32
    )
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    out = []
    for n in range(conversations):
        conv = f"t{n % tenants:02d}/c{n:06d}"
        for turn in range(ROWS_PER_CONVERSATION):
            text = " ".join(rng.choices(WORDS, k=60))
            meta = ChunkMetadata(
                conversation_id=conv,
                turn_range=TurnRange(turn, turn),
                timestamp_range=TimestampRange("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
                participants=(),
                speakers=("user",),
                intent_tag="other",
                chunk_version=1,
                deleted=False,
            )
            record = ChunkRecord(chunk_id(conv, turn, turn, 1), text, meta)
            vector = vectors[n * ROWS_PER_CONVERSATION + turn]
            out.append(StoredChunk(record, content_hash(record), vector))
    return out


def measure(store: MilvusChunkStore, tenants: int, conversations: int) -> dict[str, float]:
    rng = random.Random(1)
    query = np.random.default_rng(1).standard_normal(DIM, dtype=np.float32)
    query /= np.linalg.norm(query)

    def keyword_query() -> bm25.KeywordQuery:
        text = " ".join(rng.choices(WORDS, k=6))
        return bm25.KeywordQuery(text, {t: 1.0 for t in bm25.term_counts(text)})

    def one_conversation() -> SearchScope:
        n = rng.randrange(conversations)
        conv = f"t{n % tenants:02d}/c{n:06d}"
        return SearchScope(SearchFilters(conversation_ids=(conv,)))

    def one_tenant() -> SearchScope:
        return SearchScope(prefixes=(f"t{rng.randrange(tenants):02d}/",))

    figures: dict[str, float] = {}
    for label, scope in (
        ("scoped", one_conversation),
        ("tenant", one_tenant),
        ("unscoped", SearchScope),
    ):
        figures[f"{label}_dense_ms"] = median_ms(
            lambda scope=scope: store.search_dense(query, scope(), 300),  # type: ignore[misc]
            SEARCHES,
        )
        figures[f"{label}_keyword_ms"] = median_ms(
            lambda scope=scope: store.search_keyword(keyword_query(), scope(), 300),  # type: ignore[misc]
            SEARCHES,
        )
    return figures


def shard_sizes(store: MilvusChunkStore, data: list[StoredChunk]) -> dict[str, float]:
    sizes = Counter(store.shards.of(c.record.metadata.conversation_id) for c in data)
    return {"largest_shard_rows": max(sizes.values()), "shards_with_rows": len(sizes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=32)
    args = parser.parse_args()
    data = rows(args.tenants, args.conversations, random.Random(0))
    identity = ModelIdentity("openai", "random-384", DIM, "")
    results = {}
    for placement in ("conversation", "tenant"):
        root = Path(tempfile.mkdtemp(prefix=f"placement-{placement}-"))
        store = MilvusChunkStore(
            str(root / "m.db"),
            "c",
            identity,
            shards=args.shards,
            shards_by_tenant=placement == "tenant",
        )
        try:
            for start in range(0, len(data), 5000):
                store.upsert(data[start : start + 5000])
            with store.residency.using(store.shards.names):
                results[placement] = measure(store, args.tenants, args.conversations)
            results[placement] |= shard_sizes(store, data)
        finally:
            store.close()
    print(
        f"{len(data):,} rows, {args.conversations:,} conversations, {args.tenants} tenants,"
        f" {args.shards} shards; medians of 40, ms"
    )
    print("| | by conversation | by tenant |\n|---|---:|---:|")
    for key in results["conversation"]:
        print(f"| {key} | {results['conversation'][key]} | {results['tenant'][key]} |")


if __name__ == "__main__":
    main()
