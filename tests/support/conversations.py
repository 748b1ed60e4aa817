"""Deterministic, realistic multi-session conversations the project owns.

The suite needs long conversations (several sessions over weeks, two named speakers, user
and assistant turns, short and long turns, some Chinese, an occasional turn long enough to
be split) without any external data set. `generate` builds one from a seed: the same seed
gives the same events on every machine.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

from memsvc.domain.types import MemoryEvent

_NAMES = [
    ("Maya", "Jon"),
    ("Lena", "Omar"),
    ("Priya", "Tomas"),
    ("小林", "阿杰"),
    ("Sofia", "Kenji"),
]

_TOPICS = {
    "hiking": (
        "I went hiking near {place} last {day} and the view from the ridge was amazing.",
        "We are planning a longer trail next month, maybe three days with a tent.",
        "My boots finally broke, so I bought a new pair before the trip.",
    ),
    "cooking": (
        "I tried a new recipe for {dish} yesterday and my sister loved it.",
        "The trick was to let the dough rest overnight in the fridge.",
        "Next time I want to cook it for the whole family on {day}.",
    ),
    "work": (
        "My manager asked me to lead the {project} project starting next week.",
        "It is stressful, but I think the team is strong and we can make it.",
        "I have a presentation on {day} and I am still polishing the slides.",
    ),
    "pets": (
        "Our dog {pet} learned to fetch the newspaper this week.",
        "The vet said {pet} is healthy but should lose a little weight.",
        "We take {pet} to the park by the river every {day} morning.",
    ),
    "music": (
        "I started taking guitar lessons with a teacher from {place}.",
        "Practising every evening is hard, but my fingers hurt less now.",
        "There is a small concert on {day} where I might play one song.",
    ),
}
_ZH = (
    "我上个{day}去了{place}，风景非常漂亮。",
    "最近工作有点忙，不过周末我想好好休息一下。",
    "我打算下个月和朋友一起去爬山，你有什么建议吗？",
    "我很喜欢做饭，尤其是{dish}。",
)
_REPLIES = (
    "That sounds wonderful, {name}! How did it feel?",
    "Oh nice, tell me more about it.",
    "I remember you mentioned that before. What changed?",
    "Good luck with that, I am sure it will go well.",
    "Wow. Did anyone go with you?",
    "Ha, that is so you. What is next?",
)
_PLACES = ["Lake Tahoe", "the Alps", "Kyoto", "Yosemite", "the coast", "杭州", "Lisbon"]
_DAYS = ["Saturday", "Sunday", "Friday", "Monday", "weekend"]
_DISHES = ["lasagna", "dumplings", "paella", "ramen", "banana bread"]
_PROJECTS = ["migration", "Atlas", "billing", "onboarding"]
_PETS = ["Biscuit", "Pepper", "Luna", "Max"]
_OFFSETS = [timezone(timedelta(hours=8)), timezone(timedelta(hours=-5)), UTC]


def _fill(rng: random.Random, template: str, name: str) -> str:
    return template.format(
        place=rng.choice(_PLACES),
        day=rng.choice(_DAYS),
        dish=rng.choice(_DISHES),
        project=rng.choice(_PROJECTS),
        pet=rng.choice(_PETS),
        name=name,
    )


def _user_text(rng: random.Random, topic: str, name: str) -> str:
    roll = rng.random()
    if roll < 0.12:
        return _fill(rng, rng.choice(_ZH), name)
    lines = _TOPICS[topic]
    if roll < 0.2:  # a long story: several paragraphs
        parts = [_fill(rng, rng.choice(lines), name) for _ in range(rng.randint(12, 40))]
        return " ".join(parts)
    if roll < 0.3:
        return rng.choice(["ok", "Thanks!", "haha", "Sure.", "好的"])
    return " ".join(_fill(rng, rng.choice(lines), name) for _ in range(rng.randint(1, 3)))


def generate(
    conversation_id: str, seed: int, sessions: int = 6, turns_per_session: tuple[int, int] = (8, 24)
) -> list[MemoryEvent]:
    """A conversation of `sessions` sessions, days to weeks apart, turn ids 0.. contiguous."""
    rng = random.Random(seed)
    user_name, assistant_name = rng.choice(_NAMES)
    offset = rng.choice(_OFFSETS)
    when = datetime(2025, 1, 1, 9, 0, tzinfo=offset) + timedelta(days=rng.randint(0, 300))
    events: list[MemoryEvent] = []
    for _ in range(sessions):
        topic = rng.choice(sorted(_TOPICS))
        speaker = "user"
        for _ in range(rng.randint(*turns_per_session)):
            if speaker == "user":
                text, name = _user_text(rng, topic, user_name), user_name
            else:
                text, name = _fill(rng, rng.choice(_REPLIES), user_name), assistant_name
            events.append(
                MemoryEvent(
                    conversation_id=conversation_id,
                    turn_id=len(events),
                    speaker=speaker,
                    text=text,
                    timestamp=when.isoformat(timespec="seconds"),
                    participants=(user_name, assistant_name),
                    speaker_name=name,
                )
            )
            when += timedelta(seconds=rng.randint(20, 300))
            # Mostly alternate; sometimes the user sends two turns in a row.
            speaker = "user" if speaker == "assistant" or rng.random() < 0.15 else "assistant"
        when += timedelta(days=rng.randint(1, 20), hours=rng.randint(0, 8))
    return events
