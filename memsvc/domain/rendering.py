"""Chunk records from planned windows: the context prefix line, then one line per turn
(memsvc.domain.chunking plans the windows)."""

from __future__ import annotations

from collections.abc import Sequence

from memsvc.domain.chunking import ChunkPolicy, ChunkWindow, StoredTurn, TokenCounter, label_names
from memsvc.domain.limits import MAX_PARTICIPANTS
from memsvc.domain.prefix import (
    ROLE_LABELS_EN,
    ROLE_LABELS_ZH,
    KeywordExtractor,
    PrefixInput,
    classify_intent,
    is_chinese_window,
    render_prefix,
)
from memsvc.domain.standing import gives_rule
from memsvc.domain.text import epoch_ms, turn_is_chinese
from memsvc.domain.types import ChunkMetadata, ChunkRecord, TimestampRange, TurnRange


class ChunkRenderer:
    """Renders planned windows into chunk records: prefix line, then one line per turn."""

    def __init__(
        self, keywords: KeywordExtractor, count_tokens: TokenCounter, policy: ChunkPolicy
    ) -> None:
        self._keywords = keywords
        self.count_tokens = count_tokens  # the serving model's (the layout's budgets)
        self.policy = policy

    def render(self, conversation_id: str, window: ChunkWindow, version: int) -> ChunkRecord:
        turns = window.turns
        texts = [window.piece] if window.piece else [t.text for t in turns]
        chinese = is_chinese_window(texts)
        labels = ROLE_LABELS_ZH if chinese else ROLE_LABELS_EN  # the prefix's: the window's
        shown = label_names(
            [t.speaker_name for t in turns if t.speaker_name], self.policy, self.count_tokens
        )
        lines = []
        for turn, text in zip(turns, texts, strict=True):
            # each turn's label in its own language: an English turn of a mostly Chinese
            # window reads "User (Ana)", not "用户(Ana)"
            zh = turn_is_chinese(text, chinese)
            label = (ROLE_LABELS_ZH if zh else ROLE_LABELS_EN).get(turn.speaker, turn.speaker)
            if turn.speaker_name:
                name = shown[turn.speaker_name][0]
                label = f"{label}({name})" if zh else f"{label} ({name})"
            lines.append(f"{label}: {text}")
        participants = _participants(turns, labels)[:MAX_PARTICIPANTS]
        topic = self._keywords.keywords("\n".join(texts), 4, chinese, participants)
        # Turns need not arrive in time order: the window spans its earliest to its latest.
        by_time = sorted(turns, key=lambda t: (epoch_ms(t.timestamp, "timestamp"), t.turn_id))
        earliest, latest = by_time[0], by_time[-1]
        dates = [earliest.timestamp[:10], latest.timestamp[:10]]
        body = "\n".join(lines)
        # The reserve normally holds the prefix; if unusually long names overflow it, drop
        # topic terms, then names from the prefix (the metadata keeps them all).
        named = participants[:6]
        while True:
            prefix = render_prefix(PrefixInput(dates, named, topic, chinese))
            text = f"{prefix}\n{body}"
            if self.count_tokens([text])[0] + 2 <= self.policy.max_tokens:
                break
            if topic:
                topic = topic[:-1]
            elif named:
                named = named[:-1]
            else:
                break
        speakers = tuple(
            s for s in ("user", "assistant", "system") if any(t.speaker == s for t in turns)
        )
        intent = classify_intent(
            [x for t, x in zip(turns, texts, strict=True) if t.speaker == "user"],
            texts,
            any(gives_rule(t.speaker, x) for t, x in zip(turns, texts, strict=True)),
        )
        metadata = ChunkMetadata(
            conversation_id=conversation_id,
            turn_range=TurnRange(window.start_turn, window.end_turn),
            timestamp_range=TimestampRange(earliest.timestamp, latest.timestamp),
            participants=tuple(participants),
            speakers=speakers,
            intent_tag=intent,
            chunk_version=version,
            deleted=False,
            part_index=window.part_index,
            part_count=window.part_count,
        )
        return ChunkRecord(window.chunk_id(conversation_id, version), text, metadata)


def _participants(turns: Sequence[StoredTurn], labels: dict[str, str]) -> list[str]:
    """Display names given with the events, else the speakers' names, else role names."""
    for names in (
        [p for t in turns for p in t.participants],
        [t.speaker_name for t in turns if t.speaker_name],
        [labels.get(t.speaker, t.speaker) for t in turns],
    ):
        unique = list(dict.fromkeys(n for n in names if n))
        if unique:
            return unique
    return []
