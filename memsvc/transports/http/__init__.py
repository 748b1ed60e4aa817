"""HTTP/JSON: every MemoryService RPC in the Connect protocol (`connect`, bridged to gRPC),
how a JSON body is decoded or refused (`json_body`: objects only, nesting bounded), which
of a caller's headers reach gRPC metadata (`headers`: trace context and tokens checked),
its OpenAPI description (`openapi`, generated from the proto), the listener (`server`), and
which Host and Origin headers it answers (`hosts`: DNS rebinding)."""
