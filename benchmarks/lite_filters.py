"""What a filtered query or search costs in Milvus Lite as the collection grows.

    python benchmarks/lite_filters.py [--rows 20000,200000]

Milvus Lite 2.5.1 keeps a collection in one growing segment (milvus-lite
src/segcore_wrapper.cpp: NewSegment(..., Growing, ...)) and never seals it, so the scalar
index memsvc makes on the conversation field is not what filters use: a filter's cost grows
with the rows held, the primary key's included, as measured here. This measures it with
the store alone (8-dimensional vectors, 10 rows per conversation, an INVERTED index on the
conversation field as memsvc makes it): a query and a FLAT search filtered by conversation,
the same filtered by 10 primary keys, and an unfiltered search; medians of 20, ms.
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


def measure(rows: int, root: Path) -> dict[str, float]:
    client = MilvusClient(str(root / f"lite-{rows}.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("conversation_id", DataType.VARCHAR, max_length=64)
    schema.add_field("current", DataType.BOOL)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=8)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="IP")
    index.add_index("conversation_id", index_type="INVERTED")
    client.create_collection("t", schema=schema, index_params=index, consistency_level="Strong")
    rng = random.Random(7)
    batch = []
    for i in range(rows):
        batch.append(
            {
                "chunk_id": f"chk_{i:012d}",
                "conversation_id": f"conv-{i // 10}",
                "current": True,
                "vector": [rng.random() for _ in range(8)],
            }
        )
        if len(batch) == 5000:
            client.insert("t", batch)
            batch = []
    if batch:
        client.insert("t", batch)
    conv = f'conversation_id == "conv-{rows // 20}"'
    ids = "chunk_id in [" + ",".join(f'"chk_{(rows // 20) * 10 + j:012d}"' for j in range(10)) + "]"
    query = [[rng.random() for _ in range(8)]]
    out = {
        "query by conversation": median_ms(lambda: client.query("t", filter=conv)),
        "query by 10 keys": median_ms(lambda: client.query("t", filter=ids)),
        "search by conversation": median_ms(
            lambda: client.search("t", query, filter=f"{conv} and current == true", limit=10)
        ),
        "search by 10 keys": median_ms(
            lambda: client.search("t", query, filter=f"{ids} and current == true", limit=10)
        ),
        "search, no filter": median_ms(lambda: client.search("t", query, limit=10)),
    }
    client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=lambda s: [int(x) for x in s.split(",")], default=[20_000, 200_000]
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        results = {rows: measure(rows, Path(root)) for rows in args.rows}
    print("| ms | " + " | ".join(f"{r:,} rows" for r in results) + " |")
    print("|---|" + "---:|" * len(results))
    for key in next(iter(results.values())):
        print(f"| {key} | " + " | ".join(str(v[key]) for v in results.values()) + " |")


if __name__ == "__main__":
    main()
