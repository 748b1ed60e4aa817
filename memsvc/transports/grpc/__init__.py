"""gRPC transport: `convert` (protobuf <-> domain types), `status` (domain errors <-> status
codes and rich details), `servicer` (the handlers), `calls` (what each call goes through
around its handler: span, deadline, status, log line, metric), `server` (listening and
life cycle), `tls` (the certificate files, checked at start), `decoding` (what a request
must be before a handler sees it), `auth` (bearer tokens and roles), `admission`
(concurrency limits per kind of call)."""
