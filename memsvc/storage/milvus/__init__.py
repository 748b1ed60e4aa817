"""The vector store in Milvus: `store` (the chunk store's queries), `schema` (the
collection), `row_codec` (a chunk as a row, and back), `turn_lines` (a window's per-turn
vectors in one cell), `expressions` (filter expressions), `lite` (Milvus Lite's child
process), `watch` (health supervision and reconnection), `previous` (the collection
searches answer from during a model move)."""
