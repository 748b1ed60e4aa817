"""Keyword scoring (BM25) that memsvc computes itself, so that each tenant's statistics are
its own: another tenant's writes never move a tenant's keyword scores.

A chunk's sparse vector holds, for each of its terms, BM25's term-frequency part computed
with a fixed average length (`AVERAGE_LENGTH`): a row never depends on other rows. A query's
vector holds each of its terms' IDF over the tenants the search spans, from document
frequencies the event log keeps per tenant (documents are cut from blocks of consecutive
turns, `block_documents`). Their inner product is the chunk's BM25 score.

A tenant is the first segment of a conversation id, through its first "/" (`acme/` for
`acme/u1/s1`); ids without a "/" share the tenant "". The analyzer is the one Milvus ran
before (jieba words, lower-cased, English stemmed by Snowball), with English and digits cut
by a pattern rather than jieba (the same words, faster)."""

from __future__ import annotations

import hashlib
import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    import jieba

import Stemmer

K1 = 1.2
B = 0.75
# The average chunk length that every chunk's length is compared with, counted as Milvus's
# analyzer did: terms, and each space and punctuation mark (LoCoMo dev chunks 289, BEAM 310).
AVERAGE_LENGTH = 300.0
# The term id under which the log counts a tenant's documents (term ids are >= 0).
DOCUMENTS = -1
# Turn ids a block spans (a chunk window's default length), and the most terms of one of
# its documents (about a chunk's most: LoCoMo and BEAM dev chunks hold 116-126 terms on
# average, 180 at the 90th percentile).
BLOCK_TURNS = 4
DOCUMENT_TERMS = 180

# Runs of Han characters go to jieba; anything else is cut into words by this pattern.
_HAN = re.compile(r"([\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# What else a chunk's length counts: each space and punctuation mark.
_MARKS = re.compile(r"\s|[^\w\s]|_", re.UNICODE)
# Runs of Han characters up to this long are cut once per process (`_cut_han`).
CACHED_HAN_RUN = 32
_STEMMER = Stemmer.Stemmer("english")
_jieba_ready = False


def tenant(conversation_id: str) -> str:
    """The tenant whose statistics a conversation's turns count in."""
    cut = conversation_id.find("/")
    return conversation_id[: cut + 1] if cut >= 0 else ""


@dataclass(frozen=True)
class Tenants:
    """The tenants a search spans: `names` exactly, and every tenant starting with one of
    `starts`; `everyone` = all of them (a search no id or prefix limits)."""

    names: frozenset[str] = frozenset()
    starts: tuple[str, ...] = ()
    everyone: bool = False


EVERYONE = Tenants(everyone=True)


def tenants_of(conversation_ids: Sequence[str], prefixes: Sequence[str]) -> Tenants:
    """The tenants of a search limited to these conversations (when any), else to these
    id prefixes (a token's), else to none."""
    if conversation_ids:
        return Tenants(names=frozenset(tenant(c) for c in conversation_ids))
    if not prefixes or "" in prefixes:
        return EVERYONE
    names: set[str] = set()
    starts: list[str] = []
    for p in prefixes:
        if "/" in p:
            names.add(tenant(p))
        else:
            # `acme` spans `acme/...`, `acmeco/...` and ids without a "/" such as `acme7`
            starts.append(p)
            names.add("")
    return Tenants(names=frozenset(names), starts=tuple(sorted(starts)))


def _cut_han(run: str) -> Sequence[str]:
    # Short runs (a clause between punctuation marks) repeat: each is cut once. jieba
    # costs ~40 us a run, most of a CJK turn's counting, which the log does inside the
    # write's transaction. Long runs go to jieba each time, so the cache stays small.
    return _cut_short_han(run) if len(run) <= CACHED_HAN_RUN else _cut(run)


@lru_cache(maxsize=65_536)
def _cut_short_han(run: str) -> tuple[str, ...]:
    return tuple(_cut(run))


def _cut(run: str) -> list[str]:
    global _jieba_ready
    if not _jieba_ready:
        logging.getLogger("jieba").setLevel(logging.WARNING)
        jieba.setLogLevel(logging.WARNING)
        _jieba_ready = True
    return [w for w in jieba.cut_for_search(run) if w.strip()]


@lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


def terms(text: str) -> list[str]:
    """The text's terms in order, repeats kept."""
    out: list[str] = []
    for i, piece in enumerate(_HAN.split(text)):
        if i % 2:
            out.extend(_cut_han(piece))
        else:
            out.extend(map(_stem, _WORD.findall(piece.lower())))
    return out


@lru_cache(maxsize=262_144)
def term_id(term: str) -> int:
    """A term's dimension in the sparse vectors (and its key in the log): 32 bits of its
    hash, so the store holds no word in clear."""
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "big")


def term_counts(text: str) -> Counter[int]:
    return Counter(map(term_id, terms(text)))


def document_terms(text: str) -> set[int]:
    return set(map(term_id, terms(text)))


def doc_vector(text: str) -> dict[int, float]:
    """A chunk's sparse vector: BM25's term-frequency part of each of its terms."""
    counts = term_counts(text)
    length = sum(counts.values()) + len(_MARKS.findall(text))
    norm = K1 * (1 - B + B * length / AVERAGE_LENGTH)
    return {t: tf * (K1 + 1) / (tf + norm) for t, tf in counts.items()}


@dataclass(frozen=True)
class KeywordQuery:
    """A keyword search: its text, and its terms' weights over the tenants it spans (a store
    that scores BM25 itself reads the text)."""

    text: str
    weights: Mapping[int, float]


def idf(documents: int, frequency: int) -> float:
    return math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5))


def query_vector(
    counts: Mapping[int, int], documents: int, frequencies: Mapping[int, int]
) -> dict[int, float]:
    """A query's sparse vector: each term's IDF (times its repeats) over `documents` turns,
    `frequencies[t]` of which hold term t."""
    return {t: n * idf(documents, min(frequencies.get(t, 0), documents)) for t, n in counts.items()}


def turn_document(timestamp: str, speaker: str, speaker_name: str, clean_text: str) -> str:
    """A turn as the log counts it: as its chunks show it, with the date of their context
    line and the role and name of its line. A speaker's name is in every line of theirs and
    a date in every context line: counted, a query naming them weighs them as the common
    words they are in chunks (LoCoMo dev's questions name a speaker)."""
    return f"{timestamp[:10]} {speaker} {speaker_name}: {clean_text}"


Block = tuple[str, int]  # (conversation id, turn id // BLOCK_TURNS)


def block_documents(turns: Iterable[tuple[str, int, str]]) -> dict[Block, list[set[int]]]:
    """The documents the log counts, by block, from these (conversation id, turn id, turn
    document) live turns: a block's turns in order, cut as chunks are, into documents of at
    most DOCUMENT_TERMS terms (short turns share one, a long turn fills several). So a
    word's share of documents is about its share of chunks; per turn, common words would
    weigh several times more against rare ones than in chunks (LoCoMo dev's keyword recall
    within 20 turns fell from 0.771 to 0.758), and per block of long turns, more again
    (BEAM dev's 0.725 to 0.691)."""
    by_block: dict[Block, list[tuple[int, list[int]]]] = {}
    for conversation_id, turn_id, document in turns:
        ids = [term_id(t) for t in terms(document)]
        by_block.setdefault((conversation_id, turn_id // BLOCK_TURNS), []).append((turn_id, ids))
    blocks: dict[Block, list[set[int]]] = {}
    for block, rows in by_block.items():
        documents: list[set[int]] = []
        size = DOCUMENT_TERMS  # full: the first piece opens a document
        for _, ids in sorted(rows):
            for start in range(0, max(len(ids), 1), DOCUMENT_TERMS):
                piece = ids[start : start + DOCUMENT_TERMS]
                if size + len(piece) > DOCUMENT_TERMS:
                    documents.append(set())
                    size = 0
                documents[-1].update(piece)
                size += len(piece)
        blocks[block] = documents
    return blocks


def frequency_changes(
    before: Mapping[Block, list[set[int]]], after: Mapping[Block, list[set[int]]]
) -> dict[tuple[str, int], int]:
    """How (tenant, term) document counts change when these blocks' documents go from
    `before` to `after` (a block absent has no live turn); the tenant's DOCUMENTS row
    counts documents."""
    change: Counter[tuple[str, int]] = Counter()
    for block in before.keys() | after.keys():
        who = tenant(block[0])
        old, new = before.get(block, []), after.get(block, [])
        change[(who, DOCUMENTS)] += len(new) - len(old)
        held = Counter(t for d in new for t in d)
        held.subtract(Counter(t for d in old for t in d))
        for t, n in held.items():
            change[(who, t)] += n
    return {k: v for k, v in change.items() if v}
