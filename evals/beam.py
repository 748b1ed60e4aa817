"""Reader of BEAM conversations (used by benchmarks, not by the server or the tests).

BEAM ("Beyond a Million Tokens", repository mohammadtavakoli78/BEAM, no license file: its
data is never committed here) holds long synthetic user-assistant conversations of agent
work: code, logs, plans, standing instructions. A chat directory `chats/100K/<n>/` has
`chat.json` (batches of sessions of messages with `id`, `role`, `content`, and a
`time_anchor` such as "March-15-2024" on a batch's first message) and
`probing_questions/probing_questions.json` (questions by category, each with
`source_chat_ids`: the message ids that hold the evidence, as a list or a dict of lists).

Each message becomes a MemoryEvent with turn id = message id; a batch starts at 09:00 on
its anchor date, messages are a minute apart and sessions six hours apart. The dataset's
" ->-> 1,1" markers at the end of user messages (generation bookkeeping, not text the
user wrote) are removed. Dev split: chats 1-10 of 100K; the others are held out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memsvc.domain.types import MemoryEvent

DEV_CHATS = range(1, 11)
_MARK = re.compile(r"\s*->->\s*\d+\s*,\s*\d+\s*$")
# Category groups reported separately: standing instructions and preferences, and event
# ordering; the rest (abstention aside: it has no evidence) are the main categories.
STANDING = ("instruction_following", "preference_following")
ORDERING = ("event_ordering",)


@dataclass(frozen=True)
class Question:
    question: str
    category: str
    evidence: tuple[int, ...]  # turn ids


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    events: list[MemoryEvent]
    questions: list[Question]


def group_of(category: str) -> str:
    if category in STANDING:
        return "standing"
    if category in ORDERING:
        return "ordering"
    return "main"


def load_beam(root: Path, chats: range | list[int] = DEV_CHATS) -> list[Conversation]:
    return [_conversation(root / str(n), f"beam-{n}") for n in chats]


def _conversation(path: Path, cid: str) -> Conversation:
    chat: list[dict[str, Any]] = json.loads((path / "chat.json").read_text())
    events: list[MemoryEvent] = []
    for batch in chat:
        anchors = [m["time_anchor"] for s in batch["turns"] for m in s if m.get("time_anchor")]
        start = datetime.strptime(anchors[0], "%B-%d-%Y") if anchors else datetime(2024, 1, 1)
        t = start.replace(hour=9, tzinfo=UTC)
        for session in batch["turns"]:
            for m in session:
                t += timedelta(minutes=1)
                text = _MARK.sub("", m["content"]) if m["role"] == "user" else m["content"]
                events.append(MemoryEvent(cid, int(m["id"]), m["role"], text, t.isoformat()))
            t += timedelta(hours=6)
    events.sort(key=lambda e: e.turn_id)
    probing = json.loads((path / "probing_questions" / "probing_questions.json").read_text())
    questions = [
        Question(str(q["question"]), category, evidence)
        for category, items in probing.items()
        for q in items
        if (evidence := tuple(sorted(set(_ids(q.get("source_chat_ids"))))))
    ]
    return Conversation(cid, events, questions)


def _ids(value: object) -> Iterator[int]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _ids(v)
    elif isinstance(value, list):
        for v in value:
            yield from _ids(v)
    elif value is not None:
        yield int(str(value))
