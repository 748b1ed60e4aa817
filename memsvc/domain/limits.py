"""Every input limit in one place. Each is checked when input arrives (naming the field),
and each is within what the vector store and the model accept, so whatever the service
accepts it can also index."""

from __future__ import annotations

# -- events ---------------------------------------------------------------------------------
MAX_EVENTS_PER_CALL = 10_000
MAX_RECORDS_PER_CALL = 10_000  # chunk records per UpsertVectorRecords
MAX_CONVERSATION_ID_CHARS = 512
# The largest turn id: exact in every JSON number (JavaScript's included), and far from the
# 64-bit edge where the server's numbering (last + 1) would overflow.
MAX_TURN_ID = 2**53 - 1
# Characters of one turn's text. Longer turns are split into pieces by the chunker.
MAX_TURN_CHARS = 1_024_000  # the ceiling of MEMSVC_MAX_TURN_CHARS (default 100,000)
# Characters of an event's payload (kept as sent, never searched: an agent's raw item).
# 3,000,000 holds the tool outputs agent frameworks store whole (a 1.35M-character one broke
# an Agents SDK run), and with the largest text still fits the default 16 MiB request in
# 4-byte characters (4.1 + 12 MB).
MAX_PAYLOAD_CHARS = 3_000_000
MAX_NAME_CHARS = 256  # a participant or speaker name
MAX_PARTICIPANTS = 64  # names per event, and per chunk (the first 64 in turn order)
MAX_TIMESTAMP_CHARS = 64  # RFC 3339 needs at most 35; the store column holds 64
MAX_IDEMPOTENCY_KEY_CHARS = 128  # AppendEventsRequest.idempotency_key

# -- chunk records ----------------------------------------------------------------------------
MAX_CHUNK_ID_CHARS = 64
# Characters of a chunk's text: the store's VARCHAR holds 65,535 bytes, CJK takes 3 a character.
MAX_CHUNK_TEXT_CHARS = 16_000
MAX_INTENT_TAG_CHARS = 64

# -- queries ----------------------------------------------------------------------------------
MAX_QUERY_CHARS = 4096
MAX_BATCH_TEXTS = 256
MAX_TOP_K = 100
MAX_POP_EVENTS = 100  # turns one PopEvents may delete and return
# A request message, by default (MEMSVC_MAX_REQUEST_MB): gRPC and HTTP read it whole first.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# A response message, at most (gRPC's send limit on the server): every memsvc client (the
# CLI, the MCP gateway, the HTTP bridge, memsvc-client) receives up to this.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_TURN_BUDGET = 1000  # turns a search's hits may cover in all
MAX_FILTER_VALUES = 1000  # values per list in SearchFilters
