"""Generated from proto/memsvc/v1/memory.proto: the same messages as the server's memsvc.v1,
importable without the server. The files are written at build time from the server's stubs
(clients/python/stubs.py), so the repository holds the generated code once."""
