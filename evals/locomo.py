"""Reader of LoCoMo-format conversations (used by benchmarks and tests, not by the server).

Each conversation becomes MemoryEvents: speaker_a is the "user", speaker_b the "assistant",
turn ids run 0.. across sessions, and each session's turns are a minute apart from the
session's date. A shared image's caption is appended to the turn as "[shares <caption>]".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memsvc.domain.types import MemoryEvent

_SESSION = re.compile(r"^session_(\d+)$")


@dataclass(frozen=True)
class Question:
    question: str
    category: int
    evidence: tuple[int, ...]  # turn ids


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    events: list[MemoryEvent]
    questions: list[Question]


def _session_time(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def load_locomo(path: Path) -> list[Conversation]:
    data: list[dict[str, Any]] = json.loads(Path(path).read_text())
    return [_conversation(sample) for sample in data]


def _conversation(sample: dict[str, Any]) -> Conversation:
    conv = sample["conversation"]
    cid = str(sample["sample_id"])
    a, b = conv["speaker_a"], conv["speaker_b"]
    sessions = sorted(
        (int(m.group(1)), key) for key in conv if (m := _SESSION.match(key)) and conv[key]
    )
    events: list[MemoryEvent] = []
    dia_to_turn: dict[str, int] = {}
    for number, key in sessions:
        start = _session_time(conv[f"session_{number}_date_time"])
        for i, turn in enumerate(conv[key]):
            text = turn["text"]
            if turn.get("blip_caption"):
                text = f"{text} [shares {turn['blip_caption']}]"
            turn_id = len(events)
            dia_to_turn[turn["dia_id"]] = turn_id
            events.append(
                MemoryEvent(
                    conversation_id=cid,
                    turn_id=turn_id,
                    speaker="user" if turn["speaker"] == a else "assistant",
                    text=text,
                    timestamp=(start + timedelta(minutes=i)).isoformat(),
                    participants=(a, b),
                    speaker_name=turn["speaker"],
                )
            )
    questions = []
    for qa in sample.get("qa", []):
        evidence = tuple(
            dia_to_turn[d.strip()] for d in qa.get("evidence", []) if d.strip() in dia_to_turn
        )
        questions.append(Question(str(qa["question"]), int(qa["category"]), evidence))
    return Conversation(cid, events, questions)


def load_facts(path: Path) -> list[Conversation]:
    """Fact-shaped conversations: each of a sample's session observations (LoCoMo's
    per-session facts, each with the dialogue turn it came from) as one turn of its own,
    said by the person it is about, in session order. A question's evidence is the fact
    turns of its evidence dialogue turns (questions with none are dropped): turns that
    are independent facts, as a memory archive holds them."""
    data: list[dict[str, Any]] = json.loads(Path(path).read_text())
    return [_facts(sample) for sample in data]


def _facts(sample: dict[str, Any]) -> Conversation:
    conv, observed = sample["conversation"], sample.get("observation", {})
    cid = f"{sample['sample_id']}-facts"
    a, b = conv["speaker_a"], conv["speaker_b"]
    events: list[MemoryEvent] = []
    from_dialogue: dict[str, list[int]] = {}
    numbers = sorted(int(k.split("_")[1]) for k in observed if k.endswith("_observation"))
    for number in numbers:
        start = _session_time(conv[f"session_{number}_date_time"])
        for person, facts in observed[f"session_{number}_observation"].items():
            for fact, dia in facts:
                turn_id = len(events)
                for d in [dia] if isinstance(dia, str) else dia:
                    from_dialogue.setdefault(d.strip(), []).append(turn_id)
                events.append(
                    MemoryEvent(
                        conversation_id=cid,
                        turn_id=turn_id,
                        speaker="user" if person == a else "assistant",
                        text=str(fact),
                        timestamp=(start + timedelta(minutes=turn_id)).isoformat(),
                        participants=(a, b),
                        speaker_name=person,
                    )
                )
    questions = []
    for qa in sample.get("qa", []):
        evidence = tuple(
            t for d in qa.get("evidence", []) for t in from_dialogue.get(d.strip(), [])
        )
        if evidence:
            questions.append(Question(str(qa["question"]), int(qa["category"]), evidence))
    return Conversation(cid, events, questions)
