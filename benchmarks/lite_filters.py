"""What a filtered query or search costs in Milvus Lite as the collection grows.

    python benchmarks/lite_filters.py [--rows 20000,200000] [--shards 1,16]

Milvus Lite 2.5.1 keeps a collection in one growing segment (milvus-lite
src/segcore_wrapper.cpp: NewSegment(..., Growing, ...)) and never seals it, so the scalar
index memsvc makes on the conversation field is not what filters use: a filter's cost grows
with the rows held, the primary key's included, as measured here. This measures it with
the store alone (8-dimensional vectors, 10 rows per conversation, an INVERTED index on the
conversation field as memsvc makes it): a query and a FLAT search filtered by conversation,
the same filtered by 10 primary keys, and an unfiltered search; medians of 20, ms.

`--shards K` spreads the same rows over K collections by conversation (Milvus Lite 2.5.1
answers UNIMPLEMENTED to create_partition, so collections are the only way to split one
file's rows): a call about one conversation goes to its collection, and the unfiltered
search asks every collection and keeps the best 10.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pymilvus import DataType, MilvusClient


def median_ms(call: Callable[[], object], n: int = 20) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def measure(rows: int, root: Path, shards: int = 1) -> dict[str, float]:
    client = MilvusClient(str(root / f"lite-{rows}-{shards}.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("conversation_id", DataType.VARCHAR, max_length=64)
    schema.add_field("current", DataType.BOOL)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=8)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="IP")
    index.add_index("conversation_id", index_type="INVERTED")
    names = [f"t{k}" for k in range(shards)]
    for name in names:
        client.create_collection(
            name, schema=schema, index_params=index, consistency_level="Strong"
        )
    rng = random.Random(7)
    batches: dict[str, list[dict[str, object]]] = {name: [] for name in names}
    for i in range(rows):
        name = names[(i // 10) % shards]  # the conversation's collection
        batches[name].append(
            {
                "chunk_id": f"chk_{i:012d}",
                "conversation_id": f"conv-{i // 10}",
                "current": True,
                "vector": [rng.random() for _ in range(8)],
            }
        )
        if len(batches[name]) == 5000:
            client.insert(name, batches[name])
            batches[name] = []
    for name, batch in batches.items():
        if batch:
            client.insert(name, batch)
    one = rows // 20
    home = names[one % shards]
    conv = f'conversation_id == "conv-{one}"'
    ids = "chunk_id in [" + ",".join(f'"chk_{one * 10 + j:012d}"' for j in range(10)) + "]"
    query = [[rng.random() for _ in range(8)]]

    def search_everywhere() -> list[dict[str, object]]:
        hits = [h for name in names for h in client.search(name, query, limit=10)[0]]
        return sorted(hits, key=lambda h: -float(h["distance"]))[:10]

    out = {
        "query by conversation": median_ms(lambda: client.query(home, filter=conv)),
        "query by 10 keys": median_ms(lambda: client.query(home, filter=ids)),
        "search by conversation": median_ms(
            lambda: client.search(home, query, filter=f"{conv} and current == true", limit=10)
        ),
        "search by 10 keys": median_ms(
            lambda: client.search(home, query, filter=f"{ids} and current == true", limit=10)
        ),
        "search, no filter": median_ms(search_everywhere),
    }
    client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=lambda s: [int(x) for x in s.split(",")], default=[20_000, 200_000]
    )
    parser.add_argument("--shards", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        results = {
            (rows, shards): measure(rows, Path(root), shards)
            for rows in args.rows
            for shards in args.shards
        }
    heads = [f"{r:,} rows" + (f", {k} collections" if k > 1 else "") for r, k in results]
    print("| ms | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(results))
    for key in next(iter(results.values())):
        print(f"| {key} | " + " | ".join(str(v[key]) for v in results.values()) + " |")


if __name__ == "__main__":
    main()
