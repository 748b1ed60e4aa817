"""Keyed writes (the idempotency_key of AppendEventsRequest and PopEventsRequest): a retry
of a write whose answer was lost (a time-out after the log committed, an agent told to try
again) returns the first answer and writes nothing again.

The key is claimed in the write's own transaction (a row of the log's `idempotency`
table, primary key): a concurrent retry waits for the first and then reads its answer;
a write that fails leaves no key behind. The answer is recorded in the same transaction as
the events, so a key never says "written" for a write that was not. Keys are scoped by the
conversations a write names (two callers' keys for other conversations never meet, and a
tenant learns nothing of another's keys) and forgotten after WINDOW_S. The request is
compared by a hash of what was sent: the same key with other events is an error, not a
silent answer to a different question."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from memsvc.domain.errors import InvalidArgument
from memsvc.domain.limits import MAX_IDEMPOTENCY_KEY_CHARS
from memsvc.domain.text import has_control_chars, normal_id
from memsvc.domain.types import AppendResult, MemoryEvent, RecordError, Truncation
from memsvc.ports import LogWriter

WINDOW_S = 24 * 3600.0


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class KeyedWrite:
    key: str  # as stored: the caller's key scoped by the conversations written
    request_hash: str

    @classmethod
    def of(cls, key: str, events: Sequence[MemoryEvent], flags: Sequence[object]) -> KeyedWrite:
        """The key of a write of `events` (as sent, before the server numbers or stamps
        them) with its `flags` (allow_gaps, restore, assign_turn_ids[, expectations])."""
        conversations = sorted({normal_id(e.conversation_id) for e in events})
        sent = [dataclasses.astuple(e) for e in events]
        return cls.scoped(key, conversations, [sent, list(flags)])

    @classmethod
    def of_pop(cls, key: str, conversation_id: str, count: int, budget: int) -> KeyedWrite:
        """The key of a pop (PopEventsRequest.idempotency_key): scoped apart from appends'
        keys, so one key reused for an append and a pop names two writes."""
        return cls.scoped(key, ["pop", conversation_id], [count, budget])

    @classmethod
    def scoped(cls, key: str, scope: Sequence[str], request: object) -> KeyedWrite:
        if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS or has_control_chars(key):
            raise InvalidArgument(
                "idempotency_key",
                f"1-{MAX_IDEMPOTENCY_KEY_CHARS} characters, no control characters",
            )
        return cls(_digest([key, list(scope)]), _digest(request))

    def claim_answer(self, tx: LogWriter) -> str | None:
        """The first answer as recorded, when this key was written before (within
        WINDOW_S); None when this write is the first (then `record` it in the same
        transaction)."""
        found = tx.claim_key(self.key, self.request_hash, tx.clock() - WINDOW_S)
        if found is None:
            return None
        request_hash, answer = found
        if request_hash != self.request_hash:
            raise InvalidArgument(
                "idempotency_key",
                "used within 24 hours for another request: give a new request a new key",
            )
        return answer

    def record(self, tx: LogWriter, answer: object) -> None:
        tx.answer_key(self.key, json.dumps(answer, ensure_ascii=False))

    def claim(self, tx: LogWriter) -> AppendResult | None:
        """An append's first answer, as claim_answer."""
        answer = self.claim_answer(tx)
        return None if answer is None else _decoded(answer)

    def answer(self, tx: LogWriter, result: AppendResult) -> None:
        self.record(tx, dataclasses.asdict(result))


def _decoded(answer: str) -> AppendResult:
    data = json.loads(answer)
    return AppendResult(
        accepted=data["accepted"],
        duplicates=data["duplicates"],
        errors=[RecordError(**e) for e in data["errors"]],
        truncated=[Truncation(**t) for t in data["truncated"]],
        turn_ids=data["turn_ids"],
    )
