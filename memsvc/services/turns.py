"""Which events of a write are new turns, edits, identical re-sends or refused, and the turn
ids the server gives when it numbers them. Rules of the event log shared by
BuildIncrementalChunks and AppendEvents (memsvc.services.ingest), run inside the
transaction that holds the conversation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from memsvc.domain.errors import FailedPrecondition, InvalidArgument
from memsvc.domain.limits import MAX_TURN_ID
from memsvc.domain.records import EventRow
from memsvc.domain.text import normal_id
from memsvc.domain.types import MemoryEvent
from memsvc.ports import LogWriter


def provisional_ids(events: Sequence[MemoryEvent]) -> list[MemoryEvent]:
    """Events to be numbered by the server: each must come without a turn id (0), and gets
    its place among its conversation's events in this call (the transaction adds the base);
    one without a timestamp gets the time of receipt."""
    received = datetime.now(UTC).isoformat(timespec="milliseconds")
    places: dict[str, int] = {}
    out = []
    for i, e in enumerate(events):
        if e.turn_id != 0:
            raise InvalidArgument(
                f"events[{i}].turn_id", "must be unset (0) with assign_turn_ids: the server numbers"
            )
        key = normal_id(e.conversation_id)
        place = places.get(key, 0)
        places[key] = place + 1
        out.append(replace(e, turn_id=place, timestamp=e.timestamp or received))
    return out


def after_last_turn(tx: LogWriter, conv: str, rows: list[EventRow]) -> list[EventRow]:
    """`rows` (numbered 0.. in the order sent) moved after the conversation's last turn,
    deleted and purged turns included: an id once used is never given again."""
    _, hi, count = tx.turn_stats(conv)
    base = hi + 1 if count else 0
    if base + len(rows) - 1 > MAX_TURN_ID:
        raise InvalidArgument(
            "events",
            f"conversation {conv!r} has no turn ids left to number {len(rows)} more turns"
            f" (its last is {hi:,}; at most {MAX_TURN_ID:,})",
        )
    return [replace(r, turn_id=base + r.turn_id) for r in rows]


def changed_events(
    tx: LogWriter, conv: str, rows: list[EventRow], allow_gaps: bool, restore: bool = False
) -> list[EventRow]:
    """The new, edited and (with `restore`) restored turns; identical re-sends are no-ops;
    gaps refused unless allowed. A deleted turn (after a purge, a tombstone) stays deleted:
    sent again without `restore` it is TurnsDeleted, never taken silently for a duplicate.
    The caller writes them."""
    stored = tx.events(conv, (r.turn_id for r in rows))
    deleted = sorted(r.turn_id for r in rows if r.turn_id in stored and stored[r.turn_id].deleted)
    if deleted and not restore:
        raise TurnsDeleted(conv, deleted)
    changed = [
        r
        for r in rows
        if r.turn_id not in stored
        or stored[r.turn_id].deleted
        or not stored[r.turn_id].same_content(r)
    ]
    new_ids = sorted(r.turn_id for r in rows if r.turn_id not in stored)
    if not allow_gaps and new_ids:
        check_no_gap(tx, conv, new_ids)
    return changed


def check_no_gap(tx: LogWriter, conv: str, new_ids: list[int]) -> None:
    lo, hi, count = tx.turn_stats(conv)
    all_lo = min([*new_ids, lo] if count else new_ids)
    all_hi = max([*new_ids, hi] if count else new_ids)
    if all_hi - all_lo + 1 != count + len(new_ids):
        have = f"turns {lo}..{hi}" if count else "no turns"
        raise InvalidArgument(
            "events.turn_id",
            f"turn ids {new_ids[0]}..{new_ids[-1]} leave a gap (conversation has {have});"
            " send the missing turns or set allow_gaps",
        )


class TurnsDeleted(FailedPrecondition):
    """Events re-sent for turns that were deleted: they stay deleted unless restored."""

    reason = "TURN_DELETED"

    def __init__(self, conversation_id: str, turn_ids: list[int]) -> None:
        shown = ", ".join(str(t) for t in turn_ids[:10]) + (" ..." if len(turn_ids) > 10 else "")
        super().__init__(
            f"turns {shown} of conversation {conversation_id!r} were deleted and stay deleted;"
            " nothing of this conversation was written. To bring them back from an export,"
            " send them again with restore (admin role: `memsvc append --restore`); new"
            " turns need new turn ids"
        )
        self.turn_ids = turn_ids


class LastTurnMoved(Exception):
    """A compare-and-append (expected_last_turn) to a conversation that another write
    moved on since the caller read it: its events are refused in the call's errors."""

    def __init__(self, conversation_id: str, expected: int, last: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} ends at turn {last}, not {expected} as"
            " expected: another write came first; nothing of this conversation was written."
            " Read it again and send what is still missing"
        )


def check_last_turn(tx: LogWriter, conv: str, expected: int) -> None:
    """Raise LastTurnMoved unless the conversation's last turn id (deleted and purged turns
    included; -1 for none) is `expected`."""
    _, last, _ = tx.turn_stats(conv)
    if last != expected:
        raise LastTurnMoved(conv, expected, last)
