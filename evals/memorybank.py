"""Reader of MemoryBank dev (../shared/eval/memorybank-dev.json; its README gives the format):
seven users' ten days of exchanges with an AI companion, in Chinese (`zh`) and in the English
version of the same stories (`en`), with probing questions whose evidence names exchanges.

Each user's history is one conversation: per exchange a user turn (`query`) and an
assistant turn (`response`), timestamped on its date a minute apart. A question's evidence
is the turns of its answer exchanges (`where`: query, response or both); with
`any_one_suffices`, any one of them. The users of the two languages are the same people in
the same order, so a question of one language can be asked of the other's history."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memsvc.domain.types import MemoryEvent

LANGUAGES = ("zh", "en")


@dataclass(frozen=True)
class Question:
    qid: int
    question: str
    # each answer exchange's turns: found when all of one (any_one) or of every one are returned
    answers: tuple[tuple[int, ...], ...]
    any_one: bool


@dataclass(frozen=True)
class History:
    conversation_id: str
    events: list[MemoryEvent]
    exchanges: list[tuple[int, int]]  # (user turn, assistant turn) per exchange, in order
    questions: list[Question]


def load(path: Path, language: str) -> list[History]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return [_history(f"mb-{language}-{n}", user) for n, user in enumerate(data[language].values())]


def _history(cid: str, user: dict[str, Any]) -> History:
    events: list[MemoryEvent] = []
    exchanges: list[tuple[int, int]] = []
    place: dict[tuple[str, int], tuple[int, int]] = {}
    for day in sorted(user["history"]):
        start = datetime.fromisoformat(day).replace(hour=20, tzinfo=UTC)
        for i, exchange in enumerate(user["history"][day]):
            turns = (len(events), len(events) + 1)
            for turn_id, speaker, text in zip(
                turns, ("user", "assistant"), (exchange["query"], exchange["response"]), strict=True
            ):
                at = start + timedelta(minutes=turn_id)
                events.append(MemoryEvent(cid, turn_id, speaker, text, at.isoformat()))
            place[(day, i)] = turns
            exchanges.append(turns)
    questions = []
    for q in user["questions"]:
        if q.get("unanswerable"):
            continue
        answers = []
        for e in q["evidence"]:
            if e.get("role", "answer") != "answer":
                continue
            user_turn, assistant_turn = place[(e["date"], e["index"])]
            where = e.get("where", "both")
            answers.append(
                (user_turn,)
                if where == "query"
                else (assistant_turn,)
                if where == "response"
                else (user_turn, assistant_turn)
            )
        if answers:
            questions.append(
                Question(q["qid"], q["question"], tuple(answers), bool(q.get("any_one_suffices")))
            )
    return History(cid, events, exchanges, questions)


def found(q: Question, turns: set[int]) -> bool:
    hits = [set(a) <= turns for a in q.answers]
    return any(hits) if q.any_one else all(hits)


def asked_across(histories: list[History], askers: list[History]) -> list[History]:
    """`histories` with the questions of `askers` (the same users in another language)
    asking them: each asker's question, by its qid, with the evidence of the history's own
    question of that qid (the same story, labelled in the history's language)."""
    out = []
    for history, asker in zip(histories, askers, strict=True):
        own = {q.qid: q for q in history.questions}
        questions = [
            Question(q.qid, q.question, own[q.qid].answers, own[q.qid].any_one)
            for q in asker.questions
            if q.qid in own
        ]
        out.append(History(history.conversation_id, history.events, history.exchanges, questions))
    return out
