from __future__ import annotations

import pytest

from memsvc.domain.prefix import (
    INTENT_TAGS,
    KeywordExtractor,
    PrefixInput,
    classify_intent,
    render_prefix,
)


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        ("我叫小王，我住在上海。", "profile_update"),
        ("My name is Ana and I live in Lisbon.", "profile_update"),
        ("我打算下周去东京。", "plan"),
        ("I'm going to visit my parents next week.", "plan"),
        ("我喜欢安静的房间。", "preference"),
        ("My favorite food is sushi.", "preference"),
        ("护照放哪里了？", "question"),
        ("Where did I put my keys", "question"),
        ("谢谢", "smalltalk"),
        ("hello there", "smalltalk"),
        ("The meeting notes are attached.", "other"),
    ],
)
def test_intent_rules(text: str, tag: str) -> None:
    assert classify_intent([text], [text]) == tag


def test_intent_prefers_user_turns() -> None:
    assert classify_intent(["我喜欢猫。"], ["我喜欢猫。", "你打算什么时候去？"]) == "preference"
    assert classify_intent([], ["Where is it?"]) == "question"
    assert set(INTENT_TAGS) == {
        "instruction",
        "profile_update",
        "plan",
        "preference",
        "question",
        "smalltalk",
        "other",
    }


def test_keywords_stable_and_without_stop_words() -> None:
    kw = KeywordExtractor()
    text = "I just adopted a golden retriever puppy and we go hiking near Lake Tahoe"
    first = kw.keywords(text)
    assert first == kw.keywords(text)
    assert 2 <= len(first) <= 4
    assert not {w.lower() for w in first} & {"i", "and", "we", "a", "just"}
    zh = kw.keywords("我下周要去东京旅行，护照放哪里了？护照在抽屉里。")
    assert "护照" in zh


def test_render_prefix_forms() -> None:
    zh = render_prefix(PrefixInput(["2026-02-02"], ["用户"], ["护照", "东京"], True))
    assert zh == "[上下文：2026-02-02 用户在讨论护照、东京]"
    zh_range = render_prefix(PrefixInput(["2026-02-02", "2026-02-03"], ["用户", "助手"], [], True))
    assert zh_range == "[上下文：2026-02-02 至 2026-02-03 用户、助手]"
    en = render_prefix(
        PrefixInput(["2026-02-02", "2026-02-03"], ["Ana", "Bo", "Cy"], ["trip"], False)
    )
    assert en == "[Context: 2026-02-02 to 2026-02-03, Ana, Bo and Cy discussing trip]"
