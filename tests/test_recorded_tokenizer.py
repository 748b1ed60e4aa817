"""The tokenizer rebuilt from its record (memsvc.embedding.recorded_tokenizer) gives what
transformers' own gives, for every call memsvc makes: token counts (no special tokens, no
truncation), passages (truncated, with character offsets, then padded batch by batch) and
queries (one padded batch). The texts are the scripts and edge cases the service sees, and
Hypothesis's arbitrary Unicode; the model is the bundled one, loaded as FlagEmbedding
loads it."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsvc.embedding.backends import PARITY_PROBES
from memsvc.embedding.model import bundled_model_path, tokenize
from memsvc.embedding.recorded_tokenizer import RecordedTokenizer, TokenizerRecord

MAX_TOKENS = 256

TEXTS = [
    *PARITY_PROBES,
    "",
    " ",
    "\t\n\r  \u3000",
    "Ünïcödé café naïve résumé",
    "e\u0301 combining, ﬁ ligature, ＦＵＬＬＷＩＤＴＨ",
    "emoji 🎉👩‍👩‍👧 and flags 🇯🇵",
    "zero\u200bwidth\u200djoin\ufeffbom",
    "עברית ومعها العربية mixed with English",
    "[CLS] [SEP] [PAD] [MASK] [UNK] written by a user",
    "control \x00\x01\x7f chars",
    "日本語のテキストと한국어 텍스트",
    "URL https://example.com/a?b=c&d=e#f and email a.b@c.de",
    "word " * 400,  # far over the limit: truncation
    "很长的中文句子。" * 120,
]


@pytest.fixture(scope="module")
def tokenizers() -> tuple[Any, RecordedTokenizer]:
    from transformers import AutoTokenizer

    original = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    record = TokenizerRecord.of(original, MAX_TOKENS, 384, PARITY_PROBES)
    return original, RecordedTokenizer(record)


def _as_lists(encoded: Any) -> dict[str, list[Any]]:
    return {
        k: [list(map(tuple, r)) if k == "offset_mapping" else list(r) for r in v]
        for k, v in dict(encoded).items()
    }


def _same(pair: tuple[Any, RecordedTokenizer], texts: Sequence[str]) -> None:
    original, recorded = pair
    texts = list(texts)
    # token counts
    kw: dict[str, Any] = {"add_special_tokens": False, "truncation": False}
    assert _as_lists(recorded(texts, **kw)) == _as_lists(original(texts, **kw))
    # passages: truncated, with offsets, then padded
    kw = {"truncation": True, "max_length": MAX_TOKENS, "return_offsets_mapping": True}
    mine, theirs = recorded(texts, **kw), original(texts, **kw)
    assert _as_lists(mine) == _as_lists(theirs)
    mine.pop("offset_mapping")
    theirs.pop("offset_mapping")
    padded_mine = recorded.pad(mine, return_tensors="np")
    padded_theirs = original.pad(dict(theirs), return_tensors="np")
    assert padded_mine.keys() == dict(padded_theirs).keys()
    for key, array in padded_mine.items():
        assert array.dtype == padded_theirs[key].dtype
        assert np.array_equal(array, padded_theirs[key]), key
    # queries: one padded batch
    batch_mine = tokenize(recorded, texts, MAX_TOKENS)
    batch_theirs = tokenize(original, texts, MAX_TOKENS)
    assert batch_mine.keys() == dict(batch_theirs).keys()
    for key, array in batch_mine.items():
        assert np.array_equal(array, batch_theirs[key]), key


def test_the_recorded_tokenizer_tokenizes_as_transformers_on_the_texts_the_service_sees(
    tokenizers: tuple[Any, RecordedTokenizer],
) -> None:
    _same(tokenizers, TEXTS)
    for text in TEXTS:  # alone, each padded to itself
        _same(tokenizers, [text])
    original, recorded = tokenizers
    assert (len(recorded), recorded.class_name) == (len(original), type(original).__name__)


@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=6))
def test_the_recorded_tokenizer_tokenizes_as_transformers_on_any_text(
    tokenizers: tuple[Any, RecordedTokenizer], texts: list[str]
) -> None:
    _same(tokenizers, texts)


def test_the_record_holds_what_the_start_checks(tokenizers: tuple[Any, RecordedTokenizer]) -> None:
    original, recorded = tokenizers
    record = recorded.record
    again = original(list(PARITY_PROBES), truncation=True, max_length=MAX_TOKENS)["input_ids"]
    assert record.probe_ids == [list(x) for x in again]
    assert (record.max_tokens, record.dim) == (MAX_TOKENS, 384)
    assert record.input_names == list(original.model_input_names)


def test_the_recorded_tokenizer_pickles_and_counts_alike_where_it_is_loaded(
    tokenizers: tuple[Any, RecordedTokenizer],
) -> None:
    """Render processes take the token counter by pickle; a start from the record failed
    there ("cannot pickle '_thread.lock'") and laid out chunks without them."""
    original, recorded = tokenizers
    recorded(["warm a truncating backend"], truncation=True, max_length=MAX_TOKENS)
    again = pickle.loads(pickle.dumps(recorded))
    assert again.record == recorded.record
    _same((original, again), TEXTS)
