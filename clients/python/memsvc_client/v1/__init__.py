"""Generated from proto/memsvc/v1/memory.proto by `make proto` (do not edit): the same
messages as the server's memsvc.v1, importable without the server."""
