"""Context prefix of a chunk: time, participants, topic; and the rule-based intent tag.

No model and no network: topic terms come from jieba's TF-IDF keyword extraction over the
window's own words, the intent from the rule table `INTENT_RULES`.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memsvc.domain.keyphrases import FILLER_WORDS, key_phrases
from memsvc.domain.quick_match import QuickPattern
from memsvc.domain.standing import INSTRUCTION_TAG
from memsvc.domain.text import is_chinese

ROLE_LABELS_ZH = {"user": "用户", "assistant": "助手", "system": "系统"}
ROLE_LABELS_EN = {"user": "User", "assistant": "Assistant", "system": "System"}

# Words that carry no topic. jieba's own list is tiny; these are the common function words
# of conversational Chinese and English.
STOP_WORDS_ZH = set(
    "的 了 是 我 你 他 她 它 我们 你们 他们 这 那 这个 那个 就 都 也 还 在 有 和 与 或 吗 呢 吧 啊 哦 嗯 呀"
    " 一个 一下 一些 什么 怎么 为什么 如何 可以 可能 需要 觉得 知道 没有 不是 就是 还是 但是 因为 所以"
    " 如果 然后 现在 今天 明天 昨天 好的 谢谢 对 不 很 太 要 会 想 能 让 给 把 被 去 来 说 看 做 用户 助手"
    " 系统 上下文 讨论 已经 自己 一直 真的 非常 比较 其实 应该 还有 时候 这样 那样 怎么样 多少".split()
)
STOP_WORDS_EN = frozenset(
    """a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further get got had hadn't has hasn't
    have haven't having he he'd he'll he's her here here's hers herself him himself his how
    how's i i'd i'll i'm i've if in into is isn't it it's its itself just let's like me more
    most mustn't my myself no nor not now of off on once only or other ought our ours ourselves
    out over own really same shan't she she'd she'll she's should shouldn't so some such than
    that that's the their theirs them themselves then there there's these they they'd they'll
    they're they've this those through to too under until up very was wasn't we we'd we'll
    we're we've were weren't what what's when when's where where's which while who who's whom
    why why's will with won't would wouldn't you you'd you'll you're you've your yours yourself
    yourselves yeah yes oh hey hi hello thanks thank ok okay sure great good well lot lots
    thing things something anything really much many one two also still even yet way time
    know think going want wanted make made see glad awesome amazing cool wow nice love
    user assistant system context discussing s t m re ve ll d""".split()
)

# Intent rules, first match wins. Each is checked against the window's user turns first,
# then against the whole window. Documented in the README.
INTENT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "profile_update",
        re.compile(
            r"我叫|我的名字|我是一名|我是个|我住在|我搬到|我今年|我的工作|我在.{0,8}工作|我毕业|我结婚|"
            r"\bmy name is\b|\bi am a\b|\bi'm a\b|\bi live in\b|\bi moved to\b|\bi work (?:as|at|for)\b|"
            r"\bi(?:'m| am) \d+ years old\b|\bmy (?:job|birthday|wife|husband|partner)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "plan",
        re.compile(
            r"计划|打算|准备去|准备要|安排|行程|预订|预约|下周|下个月|明年|"
            r"\bi(?:'m| am) going to\b|\bi will\b|\bi'll\b|\bplan(?:ning|s|ned)? to\b|\bschedule\b|"
            r"\bnext (?:week|month|year|weekend)\b|\bbook(?:ed|ing)? (?:a|the)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "preference",
        re.compile(
            r"我喜欢|我不喜欢|我爱|我讨厌|我偏好|更喜欢|最喜欢|受不了|"
            r"\bi (?:really )?(?:like|love|prefer|hate|enjoy|dislike)\b|\bmy favou?rite\b|"
            r"\bi(?:'m| am) (?:a )?fan of\b",
            re.IGNORECASE,
        ),
    ),
    (
        "question",
        re.compile(
            r"[?？]|吗$|吗[。！]|什么|怎么|为什么|如何|哪里|哪儿|多少|是否|"
            r"^(?:how|what|why|when|where|who|which|can|could|should|do|does|is|are)\b",
            re.IGNORECASE | re.MULTILINE,
        ),
    ),
    (
        "smalltalk",
        re.compile(
            r"你好|您好|早上好|晚上好|晚安|谢谢|哈哈|再见|"
            r"^(?:hi|hello|hey|thanks|thank you|good (?:morning|night|evening)|bye)\b|\bhow are you\b",
            re.IGNORECASE | re.MULTILINE,
        ),
    ),
)
INTENT_OTHER = "other"
_QUICK_RULES = tuple((tag, QuickPattern(pattern)) for tag, pattern in INTENT_RULES)
INTENT_TAGS = (INSTRUCTION_TAG, *(tag for tag, _ in INTENT_RULES), INTENT_OTHER)

_DIGITS = re.compile(r"^[\d.,:%-]+$")
_TOPIC_POS = ("n", "nr", "ns", "nt", "nz", "nw", "vn", "eng")
_WORDISH = re.compile(r"\w")
_LOWER_LATIN = re.compile(r"^[a-z][a-z'-]*$")


def classify_intent(
    user_texts: Sequence[str], all_texts: Sequence[str], states_rule: bool = False
) -> str:
    """`instruction` when a user's or system's turn of the window states a standing
    instruction (`states_rule`: memsvc.domain.standing.gives_rule); else the first rule of
    INTENT_RULES matching the user turns, else the whole window."""
    if states_rule:
        return INSTRUCTION_TAG
    for texts in (user_texts, all_texts):
        joined = "\n".join(texts)
        if not joined:
            continue
        lowered = joined.lower()
        for tag, rule in _QUICK_RULES:
            if rule.search(joined, lowered):
                return tag
    return INTENT_OTHER


class KeywordExtractor:
    """A window's topic: English key phrases (memsvc.domain.keyphrases), or for Chinese
    jieba's TF-IDF keywords among its nouns and names.

    jieba's analyser (its dictionary, IDF table and part-of-speech model: ~2 s of CPU and
    ~250 MB) is loaded at the first Chinese window, once: a server whose conversations are
    not in Chinese never loads it, and every server starts that much sooner."""

    def __init__(self) -> None:
        self._tfidf: Any = None
        self._loading = threading.Lock()

    def _analyser(self) -> Any:
        with self._loading:
            if self._tfidf is None:
                # jieba 0.42.1 imports pkg_resources, which warns: nothing for us to act on
                with warnings.catch_warnings():
                    warnings.filterwarnings(
                        "ignore", message="pkg_resources is deprecated", category=UserWarning
                    )
                    import jieba
                    import jieba.analyse
                logging.getLogger("jieba").setLevel(logging.WARNING)
                jieba.setLogLevel(logging.WARNING)
                jieba.initialize()
                tfidf = jieba.analyse.TFIDF()
                tfidf.stop_words = set(tfidf.stop_words) | STOP_WORDS_ZH | STOP_WORDS_EN
                self._tfidf = tfidf
            return self._tfidf

    def keywords(
        self, text: str, limit: int = 4, chinese: bool = True, exclude: Sequence[str] = ()
    ) -> list[str]:
        """Up to `limit` topic terms, most important first; stable for the same text.
        `exclude`: names the prefix already gives (its participants)."""
        if not chinese:
            return key_phrases(text, limit, STOP_WORDS_EN, exclude)
        terms: list[str] = []
        seen = {name.lower() for name in exclude}
        # nouns, names of people, places and organisations, other proper nouns, verbal
        # nouns (护照, 东京, 行程), and Latin-script words: never the verbs and adverbs
        for word in self._analyser().extract_tags(text, topK=limit * 3, allowPOS=_TOPIC_POS):
            key = word.lower()
            if key in seen or key in FILLER_WORDS or _DIGITS.match(word):
                continue
            if not _WORDISH.search(word):
                continue
            if _LOWER_LATIN.match(word):
                # an English word inside Chinese text is code-switching ("please remind",
                # "allergic"), not a topic; names, products and acronyms keep capitals
                continue
            seen.add(key)
            terms.append(word)
            if len(terms) == limit:
                break
        return terms


@dataclass(frozen=True)
class PrefixInput:
    dates: Sequence[str]  # local dates (YYYY-MM-DD) of the window's turns, in turn order
    participants: Sequence[str]
    topic: Sequence[str]
    chinese: bool


def join_names(names: Sequence[str], chinese: bool) -> str:
    if chinese:
        return "、".join(names)
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def render_prefix(p: PrefixInput) -> str:
    """E.g. ``[上下文：2026-02-02 用户在讨论护照、东京、行程]`` or
    ``[Context: 2026-02-02 to 2026-02-03, Caroline and Melanie discussing adoption, painting]``."""
    first, last = (p.dates[0], p.dates[-1]) if p.dates else ("", "")
    if p.chinese:
        when = first if first == last else f"{first} 至 {last}"
        who = join_names(p.participants, True)
        what = f"在讨论{'、'.join(p.topic)}" if p.topic else ""
        return f"[上下文：{when} {who}{what}]"
    when = first if first == last else f"{first} to {last}"
    who = join_names(p.participants, False)
    what = f" discussing {', '.join(p.topic)}" if p.topic else ""
    return f"[Context: {when}, {who}{what}]"


def is_chinese_window(texts: Sequence[str]) -> bool:
    return is_chinese(" ".join(texts))
