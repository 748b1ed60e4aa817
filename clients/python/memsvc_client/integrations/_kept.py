"""Which item ids a conversation holds, read once and then only as it grows.

An adapter that adds a framework's items idempotently by their ids (ADK adds a whole
session again as it grows) must know what is already kept. Reading the whole conversation
on every add cost 67 ms, 473 ms and 1,250 ms at 100, 1,000 and 3,000 kept events (issue
83, item 6). `KeptIds` remembers, per conversation, the ids it has read and the last turn
it read them through; an add then asks for the last turn (one status row) and reads only
the turns after it. Whatever another process wrote comes in with those turns; if the turn
read last is gone or holds another item (a pop, a delete of the newest turn), the whole
conversation is read again. The adapter's compare-and-append (`expected_last_turn`) keeps
this exact: a write that lands after the last turn is read refuses ours, and the next try
reads it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from memsvc_client.v1 import memory_pb2 as pb

Export = Callable[[str, "tuple[int, int] | None"], Awaitable[list[pb.MemoryEvent]]]


@dataclass(frozen=True)
class _Read:
    last: int  # the conversation's last turn when read (-1: none)
    last_id: str  # the item id of that turn ("" for none)
    ids: frozenset[str]


class KeptIds:
    """The item ids each conversation holds (`id_of` a turn; "" for a turn of no item)."""

    def __init__(
        self,
        last_turn: Callable[[str], Awaitable[int]],
        export: Export,
        id_of: Callable[[pb.MemoryEvent], str],
    ) -> None:
        self._last_turn = last_turn
        self._export = export
        self._id_of = id_of
        self._read: dict[str, _Read] = {}

    async def of(self, conversation: str) -> tuple[int, frozenset[str]]:
        """The conversation's last turn and the ids of every item it holds through it."""
        last = await self._last_turn(conversation)
        known = self._read.get(conversation)
        if known is not None and known.last == last:
            return last, known.ids
        if known is not None and 0 <= known.last < last:
            turns = await self._export(conversation, (known.last, last))
            if turns and turns[0].turn_id == known.last and self._id_of(turns[0]) == known.last_id:
                return last, self._keep(conversation, known.ids, turns[1:], last)
        turns = await self._export(conversation, None) if last >= 0 else []
        return last, self._keep(conversation, frozenset(), turns, last)

    def wrote(self, conversation: str, after: int, written: list[tuple[int, str]]) -> None:
        """This process wrote items (turn id, item id) right after turn `after` (a
        compare-and-append on it): what it read stays true, with these on top."""
        known = self._read.get(conversation)
        if known is None or known.last != after or not written or min(t for t, _ in written) < 0:
            return
        last, last_id = max(written)
        self._read[conversation] = _Read(last, last_id, known.ids | {i for _, i in written})

    def forget(self, conversation: str) -> None:
        """Read the conversation whole next time (after a delete in it)."""
        self._read.pop(conversation, None)

    def _keep(
        self, conversation: str, ids: frozenset[str], turns: list[pb.MemoryEvent], last: int
    ) -> frozenset[str]:
        ids = ids | {i for i in map(self._id_of, turns) if i}
        # turns past `last` (written since it was asked) are read again next time
        at_last = [t for t in turns if t.turn_id == last]
        if last >= 0 and not at_last and turns and turns[-1].turn_id < last:
            # the last turn is deleted: nothing to check against, read whole next time
            self._read.pop(conversation, None)
            return ids
        last_id = self._id_of(at_last[0]) if at_last else ""
        self._read[conversation] = _Read(last, last_id, ids)
        return ids
