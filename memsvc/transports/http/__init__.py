"""HTTP/JSON: every MemoryService RPC in the Connect protocol (`connect`, bridged to gRPC),
its OpenAPI description (`openapi`, generated from the proto), the listener (`server`), and
which Host and Origin headers it answers (`hosts`: DNS rebinding)."""
