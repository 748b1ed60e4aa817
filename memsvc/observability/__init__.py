"""Metrics, traces and logs, used by every layer above the domain and importing nothing
above it: `metrics` (the Prometheus registry and /metrics), `figures` (running totals for
callers without Prometheus), `tracing` (OpenTelemetry spans, off unless OTEL_* asks),
`logs` (structured logging), `startup` (the phase a starting server is in, told to callers
before it serves), `process_memory` (this process's resident memory, for a memory budget
that bounds the node)."""
