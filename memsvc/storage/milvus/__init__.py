"""The vector store in Milvus: `store` (the chunk store's queries), `schema` (the
collection), `expressions` (filter expressions), `lite` (Milvus Lite's child process),
`watch` (health supervision and reconnection)."""
