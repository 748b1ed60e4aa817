"""The query words a search's explanation names (memsvc.domain.terms)."""

from __future__ import annotations

from memsvc.domain.terms import matched_terms, stem


def test_text_words_match_whole_and_by_stem_in_text_order() -> None:
    text = "User: I painted the fence and went hiking near Lake Tahoe. Tahoe!"
    assert matched_terms("Tahoe hikes painting", text) == ("painted", "hiking", "tahoe")
    assert stem("paints") == stem("painted") == stem("painting") == "paint"
    assert stem("library") == stem("libraries") == "librari"
    assert matched_terms("which libraries", "I ask about a library.") == ("library",)


def test_common_words_numbers_and_repeats() -> None:
    text = "Assistant: the meeting is at 10 in room 42."
    assert matched_terms("what is the 42 room at", text) == ("room", "42")
    assert matched_terms("nothing here", text) == ()


def test_chinese_matches_by_two_character_pieces() -> None:
    text = "用户: 我喜欢在周末去爬山。"
    assert matched_terms("周末爬山", text) == ("周末", "爬山")
    assert matched_terms("山", text) == ("山",)
    assert matched_terms("海边", text) == ()


def test_japanese_and_latin_words_inside_it() -> None:
    # ADK's memory-service cases (issue 63): a Latin word inside Japanese text is a word of
    # its own, kana match by pieces as Chinese does, and a decomposed é is the composed one
    text = "私はCafe\u0301でADKを使っています"
    assert matched_terms("Café", text) == ("café",)
    assert matched_terms("adk", text) == ("adk",)
    assert matched_terms("使って", text) == ("使っ", "って")
    assert matched_terms("プログラミング", "プログラミングを学ぶ")[0] == "プロ"
    assert matched_terms("天気", "私の名前は太郎です") == ()
