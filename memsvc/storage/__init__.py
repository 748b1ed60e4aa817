"""Implementations of memsvc.ports: the event log (sql/, on sqlite/), the vector store
(milvus/). A new backend is a new package here and one line in memsvc/app.py."""
