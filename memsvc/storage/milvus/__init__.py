"""The vector store in Milvus: `store` (the chunk store's queries), `collection` (the
connection, the collection and the store's health), `shards` (conversations spread over
several collections, and which are loaded), `schema` (the collection's fields and marker),
`row_codec` (a chunk as a row, and back), `columns` (rows written as columns), `texts` (on
Milvus Lite, the rows' texts kept beside its file), `turn_lines` (a window's per-turn
vectors in one cell), `expressions` (filter expressions), `lite` (Milvus Lite's child
process), `watch` (health supervision and reconnection), `previous` (the collection
searches answer from during a model move)."""
