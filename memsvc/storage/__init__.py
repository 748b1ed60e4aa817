"""Implementations of memsvc.ports: the event log, index queue and embedding cache in SQL
(`sql`, on `sqlite` or `postgres`), the vector store (`milvus`), and the data directory
(`datadir`). A new backend is a new package here and one line in memsvc/app.py."""
