"""Key phrases of an English window for its context prefix: noun phrases and names that
say what was discussed ("dance studio", "LGBTQ support group", "Flask app"), never the
fillers of chat ("Sounds", "Keep", "gonna") or of code ("const", "frac").

No model and no statistics table: a phrase is a run of content words between stop words
and punctuation, in prose (fenced code, code-like lines and LaTeX commands are skipped).
Word order tells a noun from a verb well enough for a prefix: the first word after a
subject pronoun, a modal, a form of "be"/"have"/"do" or "to" is taken for a verb or a
predicate and left out ("I love painting landscapes" gives "painting landscapes"), and so
is a name's verb before its object ("my dog Biscuit loves the beach": "dog Biscuit").
Phrases are ranked by how often their words occur in the window, names (capitalised
inside a sentence, or all capitals) weigh more, and no two chosen phrases share a word.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_PHRASE_WORDS = 3
MIN_WORD_CHARS = 3

# Words after which the next word is a verb or a predicate, not a topic.
VERB_CUES = frozenset(
    """i you we they he she it who to will would can could should must might may shall
    don't didn't doesn't won't can't cannot couldn't wouldn't shouldn't isn't aren't wasn't
    weren't haven't hasn't hadn't not never always often usually just also really still
    even already finally gonna wanna gotta let's please am is are was were be been being
    i'm you're we're they're he's she's it's that's there's what's i've you've we've
    they've i'll you'll we'll they'll he'll she'll i'd you'd we'd they'd have has had do
    does did get got getting""".split()
)

# Words of chat and of code that carry no topic, beyond the prefix's stop words: verbs and
# adjectives of talk, interjections, vague nouns, programming and LaTeX keywords.
FILLER_WORDS = frozenset(
    """understood understand sounds sound seems seem means mean keep kept let lets give gave
    given take took taken tell told ask asked feel felt try tried trying help helped helps
    start started stop find found call called bring brought show shown hear heard say said
    says saying put looks look looking sure definitely totally absolutely certainly exactly
    actually basically probably maybe perhaps honestly seriously literally pretty super
    awesome amazing wonderful fantastic incredible glad happy sorry proud excited stoked
    interesting tough hard easy nice fun cool wow yeah yep nope hmm huh ah aha ooh ugh lol
    haha hey hi hello bye thanks thank appreciate appreciated welcome congrats congratulations
    cheers great good best better bad worse new old little big small last first next
    lot lots bit kind sort stuff thing things something anything everything nothing someone
    anyone everyone people person way ways day days time times today tomorrow yesterday
    week weeks month months year years moment while part example examples idea ideas
    point points question questions answer answers problem issue issues case cases step steps
    work working worked works wanted want need needed needs use using used make making made
    go going gone went come coming came see seen saw know knew known think thought thinking
    love loved like liked doing done able ready ya gonna wanna gotta ok okay alright
    following below above here there per via etc vs versus within
    without across upon onto toward towards among despite unlike since shares busy
    implement ensure add adding handle adjust hide continue calculate include setup create
    check verify update install configure enable disable avoid consider remember apply
    define follow optimize improve reduce increase provide allow prevent explain describe
    understanding deserves offers includes supports allows provides ensures identify
    detect fix review
    const var function return import export from def class self true false null none nil
    void str string bool async await elif else print println console log frac
    text mathrm mathbf left right begin end cdot sqrt sum int infty quad""".split()
)

_FENCE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_LATEX = re.compile(r"\\[A-Za-z]+|\$[^$\n]*\$")
_CODE_LINE = re.compile(r"^\s{4,}\S|[{};=<>]{1}.*[{};=<>()]")
_SENTENCES = re.compile(r"[.!?…]+(?=\s|$)|\n")
_CLAUSES = re.compile(r"[.!?;:,()\[\]{}\"“”‘…—–|/*#`<>=]+|\s['’-]\s")
# -ing words that are nouns, kept at the head of a phrase ("painting class"); any other
# leading -ing word of a phrase is a verb with its object ("Fetching weather data").
ING_NOUNS = frozenset(
    """wedding building meeting morning evening painting feeling clothing ceiling pudding
    spring string thing king ring wing swing sibling offspring earring housing training
    planning learning reading writing drawing swimming running camping hiking cooking
    baking dancing singing acting gaming parking shopping marketing engineering testing
    logging caching routing hosting networking programming computing accounting banking
    nursing counseling mentoring volunteering fundraising""".split()
)

# Words that open an object or a complement: a lower-case -s or -ed word between a name and
# one of these is the name's verb ("Biscuit loves the beach", "Melanie painted a lake").
OBJECT_CUES = frozenset(
    "the a an my your his her its our their this that these those me him them us it".split()
)

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:['’][A-Za-z]+)?(?:-[A-Za-z0-9]+)*")


@dataclass(frozen=True)
class _Word:
    text: str  # as written, a possessive 's dropped
    key: str  # lowercased, a plural folded: counts "book" and "books" as one
    name: bool  # capitalised inside a sentence, all capitals, or mixed case (PostgreSQL)
    titled: bool  # in a heading or title, whose capitals say nothing


# Every window's topic is found with the same few hundred stop words: their set is made
# once, not once a window (and once a clause, which was a tenth of a long turn's parts'
# rendering).
@functools.lru_cache(maxsize=8)
def _stops(stop_words: frozenset[str]) -> frozenset[str]:
    return FILLER_WORDS | VERB_CUES | {w.lower() for w in stop_words}


def key_phrases(
    text: str, limit: int, stop_words: Iterable[str], exclude: Sequence[str] = ()
) -> list[str]:
    """Up to `limit` phrases of up to MAX_PHRASE_WORDS words, most telling first; stable
    for the same text. `exclude`: names already in the prefix (its participants)."""
    excluded = {w.lower() for name in exclude for w in _WORD.findall(name)}
    stops = _stops(frozenset(stop_words))
    blocked = stops | excluded if excluded else stops
    runs: list[list[_Word]] = []
    for clause, opens_sentence, titled in _clauses(text):
        runs += _runs(clause, opens_sentence, titled, blocked)
    counts = Counter(w.key for run in runs for w in run)
    lowered = {w.key for run in runs for w in run if w.text.islower()}
    named = {w.key for run in runs for w in run if w.name}
    scored: dict[tuple[str, ...], tuple[float, int, list[_Word]]] = {}
    for order, run in enumerate(runs):
        for phrase in _splits(run):
            keys = tuple(w.key for w in phrase)
            score = sum(counts[w.key] * (1.5 if w.name else 1.0) for w in phrase)
            score += 0.5 * (len(phrase) - 1)
            if keys in scored:  # said again: each occurrence adds to it
                best, first, words = scored[keys]
                scored[keys] = (best + 0.5 * len(phrase), first, words)
            else:
                scored[keys] = (score, order, phrase)
    chosen: list[str] = []
    taken: set[str] = set()
    for keys, (_, _, words) in sorted(scored.items(), key=lambda kv: (-kv[1][0], kv[1][1])):
        if taken & set(keys):
            continue
        taken |= set(keys)
        chosen.append(" ".join(_shown(w, lowered, named) for w in words))
        if len(chosen) == limit:
            break
    return chosen


def _clauses(text: str) -> list[tuple[str, bool, bool]]:
    """The prose of `text` cut at punctuation (code blocks, code lines and LaTeX left out),
    each clause with whether it opens a sentence (its first word's capital says nothing)
    and whether it is a heading or a title, whose capitals say nothing either: a line
    mostly capitalised ("### 3. Composite Index"), a line's first clause capitalised
    throughout ("**Secure Password Storage**: use Argon2"), or any clause of three or more
    such words."""
    prose = _LATEX.sub(" ", _FENCE.sub("\n", text))
    clauses = []
    for line in prose.splitlines():
        if _CODE_LINE.search(line):
            continue
        line_titled = _capitalised(_WORD.findall(line), 0.6)
        first = True
        for sentence in _SENTENCES.split(line):
            parts = [c for c in _CLAUSES.split(sentence) if _WORD.search(c)]
            for i, clause in enumerate(parts):
                long = [w for w in _WORD.findall(clause) if len(w) > 3]
                titled = line_titled or (_capitalised(long, 1.0) and (first or len(long) >= 3))
                clauses.append((clause, i == 0, titled))
                first = False
    return clauses


def _capitalised(words: Sequence[str], share: float) -> bool:
    long = [w for w in words if len(w) > 3]
    return len(long) >= 2 and sum(w[0].isupper() for w in long) >= share * len(long)


def _runs(
    clause: str, opens_sentence: bool, titled: bool, stops: frozenset[str]
) -> list[list[_Word]]:
    """Runs of content words of a clause; a run after a verb cue loses its first word."""
    runs: list[list[_Word]] = []
    run: list[_Word] = []
    after_cue = False
    words = [_no_possessive(w).replace("’", "'") for w in _WORD.findall(clause)]
    for i, raw in enumerate(words):
        low = raw.lower()
        if low in stops or len(low) < MIN_WORD_CHARS or "'" in low:
            if low in OBJECT_CUES and len(run) > 1 and _verb_after_name(run[-2], run[-1]):
                run.pop()
            if run:
                runs.append(run)
            run = []
            after_cue = low in VERB_CUES
            continue
        named = _named(raw, (i > 0 or not opens_sentence) and not titled)
        if after_cue and not run and not named:
            after_cue = False  # the verb or predicate itself
            continue
        after_cue = False
        run.append(_Word(raw, _fold(low), named, titled))
    if run:
        runs.append(run)
    return runs


def _verb_after_name(before: _Word, word: _Word) -> bool:
    return before.name and word.text.islower() and word.text.endswith(("s", "ed"))


def _no_possessive(word: str) -> str:
    return word[:-2] if word.endswith(("'s", "’s")) else word


def _named(word: str, inside_sentence: bool) -> bool:
    # words are ASCII (_WORD): a capital after the first letter is what lowering changes
    if len(word) > 1 and (word.isupper() or word[1:].lower() != word[1:]):
        return True  # LGBTQ, PostgreSQL, iPhone
    return inside_sentence and word[0].isupper()


def _fold(low: str) -> str:
    if low.endswith("ies") and len(low) > 4:
        return low[:-3] + "y"
    if low.endswith("s") and not low.endswith(("ss", "us", "is")) and len(low) > 3:
        return low[:-1]
    return low


def _splits(run: list[_Word]) -> list[list[_Word]]:
    """A run as phrases of at most MAX_PHRASE_WORDS words, from its end (an English noun
    phrase ends in its head: "new dance studio"), a leading verb's -ing form left out."""
    phrases = []
    end = len(run)
    while end > 0:
        phrase = run[max(0, end - MAX_PHRASE_WORDS) : end]
        head = phrase[0].key
        if len(phrase) > 1 and head.endswith("ing") and head not in ING_NOUNS:
            phrase = phrase[1:]
        phrases.append(phrase)
        end -= MAX_PHRASE_WORDS
    return phrases


def _shown(word: _Word, lowered: set[str], named: set[str]) -> str:
    """As written, except the capital of a sentence's first word written in lower case
    elsewhere, or of a title's word never written as a name."""
    if word.name or not word.text[:1].isupper():
        return word.text
    if word.key in lowered or (word.titled and word.key not in named):
        return word.text.lower()
    return word.text
