"""memsvc: conversation-memory sidecar (chunk, embed, store, search conversation turns).

Layers, top-down: `transports` (how callers reach it), `app` (the composition root),
`services` | `storage` | `embedding`, `ports` (the interfaces between them), `observability`
and `config`, and the pure `domain`. `v1` holds the generated protobuf stubs."""

__version__ = "0.1.0"
