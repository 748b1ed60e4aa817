"""The event log, index queue and embedding cache in SQL shared by every relational backend
(statements written once; a backend supplies connections and a small dialect):
`connection` (the dialect and transactions), `eventlog`, `layout` (the planned chunks),
`work` (projection work recorded with each log change), `term_docs` (keyword statistics
per tenant), `queue` (the worker's steps), `cache` (embeddings by content)."""
