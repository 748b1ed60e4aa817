from __future__ import annotations

import subprocess
import sys

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


def test_english_topics_are_phrases_not_fillers() -> None:
    """Regression (issue 66, 8): jieba's TF-IDF ranked English words without English
    statistics, so a prefix read "discussing Understood, give, version, numbers"."""
    kw = KeywordExtractor()
    window = (
        "Understood, give me the version numbers and I'll check them.\n"
        "The version numbers are 2.5.1 for Milvus Lite and 2.6 for pymilvus."
    )
    topic = kw.keywords(window, 4, chinese=False)
    assert topic[0] == "version numbers"
    assert "Milvus Lite" in topic  # a name keeps its words together and its capitals
    assert not {w.lower() for t in topic for w in t.split()} & {"understood", "give", "check"}


def test_english_topics_leave_out_chat_fillers_verbs_code_and_the_speakers() -> None:
    kw = KeywordExtractor()
    window = (
        "Hey Caroline! Sounds awesome, keep it up! I'm gonna keep chasing those dreams.\n"
        "Dance is my passion and I love painting landscapes at the new dance studio.\n"
        "```js\nconst studio = fetchStudio(id);\n```\n"
        "Proud of you, Melanie! Your dance studio will be a success."
    )
    topic = kw.keywords(window, 4, chinese=False, exclude=["Caroline", "Melanie"])
    assert topic[0] == "dance studio"  # said three times, as a phrase
    assert "painting landscapes" in topic  # the verb before it ("love") left out
    words = {w.lower() for t in topic for w in t.split()}
    assert not words & {"sounds", "awesome", "keep", "gonna", "love", "const", "fetchstudio"}
    assert not words & {"caroline", "melanie"}  # the prefix names them already
    assert topic == kw.keywords(window, 4, chinese=False, exclude=["Caroline", "Melanie"])


def test_a_names_verb_before_its_object_is_left_out() -> None:
    # issue 84: an English context line read "dog Biscuit loves, Shinkansen, ..."
    kw = KeywordExtractor()
    window = (
        "My dog Biscuit loves the beach. We rode the Shinkansen to Kyoto.\n"
        "I keep my Python scripts in one repo."
    )
    topic = kw.keywords(window, 4, chinese=False)
    assert "dog Biscuit" in topic and "Shinkansen" in topic
    assert "Python scripts" in topic  # a name's plural noun is no verb: no object follows
    assert not {w for t in topic for w in t.split()} & {"loves"}


def test_title_capitals_are_not_names() -> None:
    kw = KeywordExtractor()
    window = "### Secure Password Storage\nStore each password with Argon2 in PostgreSQL."
    topic = kw.keywords(window, 4, chinese=False)
    assert "secure password storage" in topic
    assert "Argon2" in topic and "PostgreSQL" in topic


def test_chinese_topics_are_nouns() -> None:
    kw = KeywordExtractor()
    topic = kw.keywords("谢谢！我还想订一家新宿附近的酒店。护照在书桌左边的抽屉里。")
    assert "想订" not in topic  # a verb
    assert {"新宿", "护照", "书桌"} <= set(topic)


def test_a_mixed_chinese_window_is_topiced_in_chinese() -> None:
    """Issue 82: `大阪、please、remind、allergic` was the context line of a Chinese turn
    with English words in it; lowercase English words are code-switching, not topics,
    and names keep their capitals."""
    kw = KeywordExtractor()
    topic = kw.keywords(
        "我下周去大阪出差，please remind me 我对花生 allergic，记得订 Hilton 酒店。"
    )
    assert not {"please", "remind", "allergic", "me"} & set(topic)
    assert {"大阪", "花生", "Hilton"} <= set(topic)
    assert "Python" in kw.keywords("我在用 Python 写一个客户端，bug 很多。")


def test_render_prefix_forms() -> None:
    zh = render_prefix(PrefixInput(["2026-02-02"], ["用户"], ["护照", "东京"], True))
    assert zh == "[上下文：2026-02-02 用户在讨论护照、东京]"
    zh_range = render_prefix(PrefixInput(["2026-02-02", "2026-02-03"], ["用户", "助手"], [], True))
    assert zh_range == "[上下文：2026-02-02 至 2026-02-03 用户、助手]"
    en = render_prefix(
        PrefixInput(["2026-02-02", "2026-02-03"], ["Ana", "Bo", "Cy"], ["trip"], False)
    )
    assert en == "[Context: 2026-02-02 to 2026-02-03, Ana, Bo and Cy discussing trip]"


def test_jiebas_analyser_is_loaded_by_the_first_chinese_window_only() -> None:
    """A server whose conversations are not in Chinese never loads jieba's analyser (its
    dictionary and part-of-speech model: ~250 MB and ~2 s of CPU at each start before)."""
    script = (
        "import sys\n"
        "from memsvc.domain.prefix import KeywordExtractor\n"
        "kw = KeywordExtractor()\n"
        "kw.keywords('We go hiking near Lake Tahoe with the puppy', chinese=False)\n"
        "print('jieba.analyse' in sys.modules)\n"
        "print(kw.keywords('我下周要去东京旅行，护照放哪里了？护照在抽屉里。'))\n"
        "print('jieba.analyse' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    before, chinese, after = run.stdout.splitlines()
    assert (before, after) == ("False", "True")
    assert "护照" in chinese
