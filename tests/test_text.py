from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsvc.domain.errors import InvalidArgument
from memsvc.domain.ids import chunk_id
from memsvc.domain.text import (
    clean_text,
    epoch_ms,
    fold_text,
    has_kept_punctuation,
    is_chinese,
    normal_name,
    parse_rfc3339,
    turn_is_chinese,
)


def test_clean_text_nfkc_controls_and_whitespace() -> None:
    assert clean_text("  Ｈｅｌｌｏ\u0000\u200b  world\n\t again  ") == "Hello world again"
    assert clean_text("\x07\x1b") == ""
    # full-width punctuation and the ellipsis stay as written (issue 66); the ideographic
    # space is whitespace, folded; names fold everything (filters match them)
    assert clean_text("你好，　世界！真的吗？……") == "你好， 世界！真的吗？……"
    assert clean_text("（注）Ｎｏ．１２ ﬁle") == "（注）No．12 file"
    assert has_kept_punctuation("真的吗？") and not has_kept_punctuation("真的吗?")
    assert fold_text("你好，　世界！……") == normal_name("你好，　世界！……") == "你好, 世界!......"


def _cleaned_char_by_char(text: str) -> str:
    """Cleaning as text form 2 was first written: a look at every character. The log's
    clean text is in this form, so a faster cleaning must give the same, to the character."""
    chars = []
    for ch in text:
        if ch in "\n\r\t\v\f":
            chars.append(" ")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            continue
        else:
            chars.append(ch)
    return re.sub(r"\s+", " ", "".join(chars)).strip()


@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=400))
def test_cleaning_gives_what_the_character_by_character_cleaning_gave(text: str) -> None:
    assert fold_text(text) == _cleaned_char_by_char(unicodedata.normalize("NFKC", text))


def test_is_chinese() -> None:
    assert is_chinese("我喜欢Python和Java")
    assert not is_chinese("I like 寿司 very much, especially at dinner time")
    assert not is_chinese("plain English")
    # issue 63: Japanese memories carried the Chinese context line and labels
    assert not is_chinese("私の名前は太郎です")
    assert not is_chinese("カレーが好きです")


@pytest.mark.parametrize(
    "value",
    ["2026-02-02T10:15:30+08:00", "2026-02-02T10:15:30Z", "2026-02-02T10:15:30.123-05:00"],
)
def test_rfc3339_accepts_offsets(value: str) -> None:
    assert parse_rfc3339(value, "ts").tzinfo is not None


@pytest.mark.parametrize("value", ["2026-02-02T10:15:30", "2026-02-02", "yesterday", ""])
def test_rfc3339_rejects_naive_or_malformed(value: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_rfc3339(value, "events[0].timestamp")
    assert err.value.field == "events[0].timestamp"


def test_epoch_respects_offset() -> None:
    assert epoch_ms("2026-02-02T10:00:00+08:00", "t") == epoch_ms("2026-02-02T02:00:00Z", "t")


def test_chunk_id_formula() -> None:
    import hashlib

    expected = "chk_" + hashlib.sha256(b"conv-1\x1f0\x1f3\x1f1").hexdigest()[:32]
    assert chunk_id("conv-1", 0, 3, 1) == expected
    assert chunk_id("conv-1", 0, 3, 2) != expected
    piece = "chk_" + hashlib.sha256(b"conv-1\x1f0\x1f0\x1f1\x1f2").hexdigest()[:32]
    assert chunk_id("conv-1", 0, 0, 1, part_index=2) == piece


def test_a_turn_label_follows_the_turn_when_its_language_is_plain() -> None:
    # issue 66: a mixed chunk labelled its English turns 用户(Ana) / 助手
    assert turn_is_chinese("我们下周去东京，护照放哪了？", window_is_chinese=False)
    assert not turn_is_chinese("Where did I put my passport again?", window_is_chinese=True)
    # too short or without letters: the window decides
    assert turn_is_chinese("ok", window_is_chinese=True)
    assert turn_is_chinese("好", window_is_chinese=False)  # one CJK character: Chinese
    assert turn_is_chinese("42 / 7 = 6", window_is_chinese=True)
    assert not turn_is_chinese("42 / 7 = 6", window_is_chinese=False)
