"""gRPC transport: `convert` (protobuf <-> core types), `status` (domain errors <-> status
codes and rich details), `servicer` (the handlers), `server` (listening and life cycle)."""
