"""memsvc: conversation-memory sidecar (chunk, embed, store, search conversation turns)."""

__version__ = "0.1.0"
