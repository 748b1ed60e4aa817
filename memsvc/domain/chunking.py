"""Windows of consecutive turns (memsvc.domain.rendering makes them chunk records).

Policy (also in the README):
- Turns are grouped into exchanges: a run of user turns plus the replies that follow it, so
  a user turn stays with its reply. An exchange larger than a window is split into turns.
- A window takes whole exchanges while it holds at most `max_turns` turns and its lines fit
  the token budget (`max_tokens` minus a reserve for the context prefix).
- The next window starts at the earliest exchange that keeps the overlap with the previous
  window within `overlap_turns` turns.
- A long turn (its line over `turn_unit_tokens`, or over a piece's characters: the store
  holds 16,000 per chunk) is a unit of its own, never grouped: pasted code, a log, a long
  answer. It is split at sentence boundaries into parts of at most `part_tokens`, each its
  own chunk (part_index / part_count); nothing is truncated. A sentence longer than a
  part is cut into slices. Grouped with its neighbours, a long turn would outweigh them
  in the window's vector and cost a caller's turn budget for turns it does not need
  (benchmarks/archive/2026-11-25.md, Retrieval v3).
- A user's or system's turn that states a standing instruction (memsvc.domain.standing)
  is a window of its own too. Search returns such chunks in a list of their own, not in
  the hits: grouped with its neighbours, a rule would take the facts said around it out
  of the hits.
- Turns whose ids are more than MAX_ID_GAP apart are never in one window.
- A chunk names at most 64 participants (the first in turn order): whatever the input,
  every chunk fits the model and the store, so what is accepted is indexable.
- The layout is a pure function of the live turns, so building a conversation in one call
  or in many gives the same chunks. The last window is a "tail" while turns keep arriving.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memsvc.domain.ids import chunk_id
from memsvc.domain.standing import gives_rule

TokenCounter = Callable[[Sequence[str]], list[int]]

_SENTENCE_END = re.compile(r"(?<=[。！？!?；;.…])\s*")


@dataclass(frozen=True)
class StoredTurn:
    """A live turn from the event log, already cleaned and token-counted."""

    turn_id: int
    speaker: str
    text: str
    timestamp: str
    participants: tuple[str, ...] = ()
    speaker_name: str = ""
    tokens: int = 0


@dataclass(frozen=True)
class ChunkPolicy:
    max_turns: int = 4
    overlap_turns: int = 2
    max_tokens: int = 512
    # A turn whose line costs more tokens is a unit of its own (a "turn unit"), in parts of
    # at most `part_tokens`; its vector is made of its head and its gist, the first
    # `gist_tokens` (memsvc.domain.vectors).
    turn_unit_tokens: int = 128
    part_tokens: int = 256
    gist_tokens: int = 64
    # Tokens kept for the prefix line and the model's special tokens.
    prefix_reserve: int = 64
    # Tokens of a line's role label ("User (Caroline): "); a speaker name longer than
    # `name_allowance` tokens costs its extra tokens on top.
    line_overhead: int = 8
    name_allowance: int = 4
    # Tokens of a speaker name shown in a line label; a longer name is shortened there
    # (with "…"; the chunk's metadata keeps it whole), so a label never eats the budget.
    max_label_name_tokens: int = 48
    # Characters of a window's lines, and of one piece of a split turn. Only text with very
    # few tokens per character (e.g. long runs of unbroken symbols) reaches these before the
    # token budget; they keep every chunk within the store's 16,000 characters.
    max_line_chars: int = 12_000
    max_piece_chars: int = 4_000

    @property
    def line_budget(self) -> int:
        return self.max_tokens - self.prefix_reserve

    @property
    def part_budget(self) -> int:
        """Tokens of one part of a turn unit, its role label included."""
        return min(self.part_tokens, self.line_budget)

    def fingerprint(self) -> str:
        # r2: time ranges span the earliest to the latest turn; long names shortened in labels
        # r3: long turns are units of their own, in parts; standing instructions tagged
        # r4: a standing instruction's turn is a window of its own
        return (
            f"{self.max_turns}/{self.overlap_turns}/{self.max_tokens}/{self.prefix_reserve}"
            f"/{self.max_label_name_tokens}/{self.turn_unit_tokens}/{self.part_tokens}"
            f"/{self.gist_tokens}/r4"
        )


@dataclass(frozen=True)
class ChunkWindow:
    """Turns of one chunk; for a part of a turn unit, `piece` holds the part's text and
    `head` the first part's."""

    turns: tuple[StoredTurn, ...]
    part_index: int = 0
    part_count: int = 1
    piece: str = ""
    head: str = ""

    @property
    def start_turn(self) -> int:
        return self.turns[0].turn_id

    @property
    def end_turn(self) -> int:
        return self.turns[-1].turn_id

    def chunk_id(self, conversation_id: str, version: int) -> str:
        return chunk_id(conversation_id, self.start_turn, self.end_turn, version, self.part_index)

    def source_hash(self, version: int, policy: ChunkPolicy) -> str:
        """Hash of everything the chunk's text and metadata are derived from."""
        payload = [version, policy.fingerprint(), self.part_index, self.part_count, self.piece]
        for t in self.turns:
            payload.append(
                [t.turn_id, t.speaker, t.speaker_name, t.text, t.timestamp, list(t.participants)]
            )
        blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class _Unit:
    turns: tuple[StoredTurn, ...]
    tokens: int
    chars: int
    oversize: bool = False
    # A user's or system's standing instruction: a window of its own, so the facts said
    # around it stay in the hits instead of riding in the `standing` list with the rule.
    rule: bool = False

    @property
    def alone(self) -> bool:
        """Never shares a window with its neighbours."""
        return self.oversize or self.rule


def starts_exchange(prev: StoredTurn, turn: StoredTurn) -> bool:
    """A user's turn after someone else's starts an exchange."""
    return turn.speaker == "user" and prev.speaker != "user"


def _exchanges(turns: Sequence[StoredTurn]) -> list[list[StoredTurn]]:
    groups: list[list[StoredTurn]] = []
    for i, turn in enumerate(turns):
        if i == 0 or starts_exchange(turns[i - 1], turn):
            groups.append([turn])
        else:
            groups[-1].append(turn)
    return groups


def label_names(
    names: Sequence[str], policy: ChunkPolicy, count_tokens: TokenCounter
) -> dict[str, tuple[str, int]]:
    """Each speaker name as a line label shows it, and its tokens: names longer than
    `max_label_name_tokens` are cut (at a character) and end with "…"."""
    unique = sorted(set(names))
    out: dict[str, tuple[str, int]] = {}
    cap = policy.max_label_name_tokens
    for name, n in zip(unique, count_tokens(unique), strict=True):
        if n <= cap:
            out[name] = (name, n)
            continue
        lo, hi = 0, len(name)
        while lo < hi:  # the longest head that fits with its ellipsis
            mid = (lo + hi + 1) // 2
            if count_tokens([name[:mid] + "…"])[0] <= cap:
                lo = mid
            else:
                hi = mid - 1
        shown = name[:lo] + "…"
        out[name] = (shown, count_tokens([shown])[0])
    return out


class _LineCost:
    """Tokens and characters a turn's line costs in a chunk, its role label included."""

    def __init__(
        self, turns: Sequence[StoredTurn], policy: ChunkPolicy, count_tokens: TokenCounter
    ) -> None:
        labels = label_names(
            [t.speaker_name for t in turns if t.speaker_name], policy, count_tokens
        )
        self._name_extra = {
            name: max(0, n - policy.name_allowance) for name, (_, n) in labels.items()
        }
        self._shown = {name: shown for name, (shown, _) in labels.items()}
        self.policy = policy

    def label_tokens(self, turn: StoredTurn) -> int:
        return self.policy.line_overhead + self._name_extra.get(turn.speaker_name, 0)

    def tokens(self, turn: StoredTurn) -> int:
        return turn.tokens + self.label_tokens(turn)

    def chars(self, turn: StoredTurn) -> int:
        return len(turn.text) + len(self._shown.get(turn.speaker_name, "")) + 16

    def oversize(self, turn: StoredTurn) -> bool:
        """A turn unit: a long turn, never grouped with others."""
        return (
            self.tokens(turn) > min(self.policy.turn_unit_tokens, self.policy.line_budget)
            or self.chars(turn) > self.policy.max_piece_chars
        )


def _units(turns: Sequence[StoredTurn], policy: ChunkPolicy, cost: _LineCost) -> list[_Unit]:
    units: list[_Unit] = []
    for group in _exchanges(turns):
        tokens = sum(cost.tokens(t) for t in group)
        chars = sum(cost.chars(t) for t in group)
        alone = [(cost.oversize(t), gives_rule(t.speaker, t.text)) for t in group]
        if (
            len(group) <= policy.max_turns
            and tokens <= policy.line_budget
            and chars <= policy.max_line_chars
            and not any(big or rule for big, rule in alone)
        ):
            units.append(_Unit(tuple(group), tokens, chars))
            continue
        for t, (big, rule) in zip(group, alone, strict=True):
            units.append(_Unit((t,), cost.tokens(t), cost.chars(t), big, rule and not big))
    return units


# Turns whose ids are further apart than this (a restore far out, thousands of turns deleted
# between two) are never in one window: a chunk's turn range then spans at most
# max_turns * MAX_ID_GAP ids, whatever the ids are (up to 2^53), so what walks a chunk's
# range (hit selection, turn budgets, vectors) stays bounded. A turn id of 10^12 beside
# turn 0 once made one chunk of range 0..10^12, and its search 23 GB.
MAX_ID_GAP = 1000


def plan_windows(
    turns: Sequence[StoredTurn], policy: ChunkPolicy, count_tokens: TokenCounter
) -> list[ChunkWindow]:
    """The chunk layout of a conversation's live turns (sorted by turn_id): each run of
    turns without a gap of more than MAX_ID_GAP ids is planned on its own."""
    cost = _LineCost(turns, policy, count_tokens)
    windows: list[ChunkWindow] = []
    start = 0
    for i in range(1, len(turns) + 1):
        if i == len(turns) or turns[i].turn_id - turns[i - 1].turn_id > MAX_ID_GAP:
            windows += _plan_run(turns[start:i], policy, count_tokens, cost)
            start = i
    return windows


def _plan_run(
    turns: Sequence[StoredTurn],
    policy: ChunkPolicy,
    count_tokens: TokenCounter,
    cost: _LineCost,
) -> list[ChunkWindow]:
    units = _units(turns, policy, cost)
    windows: list[ChunkWindow] = []
    i = 0
    while i < len(units):
        if units[i].oversize:
            turn = units[i].turns[0]
            windows.extend(_split_turn(turn, policy, cost.label_tokens(turn), count_tokens))
            i += 1
            continue
        if units[i].rule:
            windows.append(ChunkWindow(units[i].turns))
            i += 1
            continue
        j, n_turns, n_tokens, n_chars = i, 0, 0, 0
        while (
            j < len(units)
            and not units[j].alone
            and n_turns + len(units[j].turns) <= policy.max_turns
            and n_tokens + units[j].tokens <= policy.line_budget
            and n_chars + units[j].chars <= policy.max_line_chars
        ):
            n_turns += len(units[j].turns)
            n_tokens += units[j].tokens
            n_chars += units[j].chars
            j += 1
        windows.append(ChunkWindow(tuple(t for u in units[i:j] for t in u.turns)))
        if j >= len(units):
            break
        if units[j].alone:
            i = j
            continue
        # Earliest start after i whose overlap with this window stays within overlap_turns.
        k, overlap = j, 0
        while k - 1 > i and overlap + len(units[k - 1].turns) <= policy.overlap_turns:
            k -= 1
            overlap += len(units[k].turns)
        i = k
    return windows


def _split_turn(
    turn: StoredTurn, policy: ChunkPolicy, label_tokens: int, count_tokens: TokenCounter
) -> list[ChunkWindow]:
    return list(_turn_parts(turn, policy, label_tokens, count_tokens))


# A long turn is split when its conversation is planned and again when its parts' vectors
# are made (`turn_windows`), each split counting tokens sentence by sentence: the last few
# splits are kept.
@functools.lru_cache(maxsize=16)
def _turn_parts(
    turn: StoredTurn, policy: ChunkPolicy, label_tokens: int, count_tokens: TokenCounter
) -> tuple[ChunkWindow, ...]:
    budget = policy.part_budget - label_tokens
    max_chars = policy.max_piece_chars
    pieces: list[str] = []
    current = ""
    for sentence in _fit_sentences(_SENTENCE_END.split(turn.text), budget, max_chars, count_tokens):
        candidate = f"{current} {sentence}".strip() if current else sentence
        if current and (len(candidate) > max_chars or count_tokens([candidate])[0] > budget):
            pieces.append(current)
            current = sentence
        else:
            current = candidate
    if current:
        pieces.append(current)
    return tuple(
        ChunkWindow((turn,), part_index=i, part_count=len(pieces), piece=p, head=pieces[0])
        for i, p in enumerate(pieces)
    )


def turn_windows(
    turn: StoredTurn, policy: ChunkPolicy, count_tokens: TokenCounter
) -> list[ChunkWindow]:
    """The chunks a turn has when it stands alone, as `plan_windows` plans them: a turn
    unit's parts, else one chunk of that turn."""
    cost = _LineCost([turn], policy, count_tokens)
    if cost.oversize(turn):
        return _split_turn(turn, policy, cost.label_tokens(turn), count_tokens)
    return [ChunkWindow((turn,))]


# Slices a sentence longer than a piece is first cut into: small enough that counting
# their tokens is cheap, so splitting is linear in the turn's length.
_SLICE_CHARS = 1_000


def _cut(text: str, size: int) -> tuple[str, str]:
    """Cut `text` after at most `size` characters, at a space when one is near."""
    if len(text) <= size:
        return text, ""
    space = text.rfind(" ", 0, size)
    at = space if space > size // 2 else size
    return text[:at].strip(), text[at:].strip()


def _fit_sentences(
    sentences: Sequence[str], budget: int, max_chars: int, count_tokens: TokenCounter
) -> list[str]:
    """Sentences, with any sentence over the token budget or `max_chars` cut into slices
    that fit."""
    sentences = [s for s in sentences if s]
    out: list[str] = []
    for sentence, tokens in zip(sentences, count_tokens(sentences), strict=True):
        if tokens <= budget and len(sentence) <= max_chars:
            out.append(sentence)
            continue
        slices: list[str] = []
        rest = sentence
        while rest:
            head, rest = _cut(rest, min(_SLICE_CHARS, max_chars))
            slices.append(head)
        for piece, n in zip(slices, count_tokens(slices), strict=True):
            if n <= budget or len(piece) <= 1:
                out.append(piece)
            else:  # dense text (about a token a character): halve until it fits
                halves = _cut(piece, len(piece) // 2)
                out.extend(_fit_sentences(halves, budget, max_chars, count_tokens))
    return out
