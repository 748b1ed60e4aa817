"""HTTP/JSON: every MemoryService RPC in the Connect protocol (`connect`, bridged to gRPC),
its OpenAPI description (`openapi`, generated from the proto), and the listener (`server`)."""
