"""How callers reach memsvc: `grpc` (the service), `http` (the same RPCs in the Connect
protocol, bridged to gRPC), `console` (the web console on the HTTP port), `mcp` (memory
tools for agents, a client of a running server) and `cli` (the `memsvc` command). Each
converts its own wire format to the domain's types and calls what memsvc.app builds; the
count limits every transport checks on a request before decoding it are in `wire`, and the
channel memsvc's own clients open to a server in `channel`."""
