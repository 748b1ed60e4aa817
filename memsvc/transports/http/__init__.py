"""HTTP/JSON: every MemoryService RPC in the Connect protocol, bridged to gRPC."""
