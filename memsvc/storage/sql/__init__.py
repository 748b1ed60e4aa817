"""The event log, index queue and embedding cache in SQL shared by every relational backend
(statements written once; a backend supplies connections and a small dialect)."""
