"""Whether a sentence says a held fact's slot changed, in words the rules could not read as a value.

A minute can say that a slot changed in words no rule reads ("OK, we're going weekly. Starting next Monday
every train is one week long", of the trains' cadence, held as every two weeks). Left alone, the context would
go on stating the older value as what we know now. The facts pool keeps such a sentence as a statement that
*questions* the held fact (`contracts.facts.RelationKind.QUESTIONS`), and the context shows the two side by
side. A questioning retires nothing, since a statement never retires another on topic overlap alone. It is
still kept narrow (`questions`), because every one of them is shown:

- the sentence states: no question, hedge or proposal (`workers.rules.fact_text.asks_or_hedges`);
- it says a change (`CHANGE_CUES`: a change verb of `workers.rules.open_slots.CHANGE_VERBS`, "now",
  "starting", "from now on", "no longer", "instead", "extended" ...);
- it names the slot: by the attribute (its name or the rules' vocabulary for it; one that names nothing, such
  as "value", does not count) with the subject, or plainly ("the observation window") where no other held
  subject is named in full ("the auth gateway's session TTL" is not the billing service's); or by the subject
  alone (all its content words, or its head after a determiner or another word of it: "every train" names the
  release trains, "the payments service" does not name the auth service) where the sentence names no other
  attribute ("the billing service has its request timeout set at 2 minutes" is not its session TTL);
- it holds a value of the held value's kind (`value_kinds`: a cadence, a date, a time of day, a percentage, a
  duration, a count, a size, a version) that the held value does not hold, numbers compared as digits (a
  restatement questions nothing: "five seconds" restates "5 seconds");
- exactly one held slot fits best (the attribute or the whole subject named before a subject's head alone):
  two say the sentence is not about one of them.

Pure functions of the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from workers.rules.fact_text import ATTRIBUTES, asks_or_hedges, sentences
from workers.rules.open_slots import CHANGE_VERBS
from workers.rules.relative_dates import ABSOLUTE, NUMBER_WORDS

# Words that say a value changed, beside the change verbs ("we're going weekly", "it now ends on ...").
CHANGE_CUES = frozenset(
    {
        *CHANGE_VERBS,
        "now", "starting", "start", "starts", "from now on", "no longer", "instead", "henceforth", "anymore",
        "going", "becomes", "became", "replaced", "replaces", "effective", "as of", "new",
    }
)  # fmt: skip
_CUE = re.compile(
    r"\b(?:"
    + "|".join(sorted((re.escape(c).replace(r"\ ", r"\s+") for c in CHANGE_CUES), key=len, reverse=True))
    + r")\b",
    re.I,
)

# A value's kind, by the expressions that carry one.
_NUMBER_WORD = r"(?:\d+|" + "|".join(NUMBER_WORDS) + ")"
_KINDS: dict[str, re.Pattern[str]] = {
    "cadence": re.compile(
        r"\b(?:daily|weekly|monthly|quarterly|yearly|annually|nightly|hourly|bi-?weekly|fortnightly"
        rf"|twice\s+a\s+(?:day|week|month|year)|once\s+a\s+(?:day|week|month|quarter|year)"
        rf"|every\s+(?:other\s+|{_NUMBER_WORD}\s+)?(?:day|week|month|quarter|year|hour|night|sprint|weekday)s?"
        rf"|{_NUMBER_WORD}[\s-]+(?:day|week|month)s?[\s-]+long)\b",
        re.I,
    ),
    "date": re.compile(rf"\b(?:{ABSOLUTE}|\d{{4}}-\d{{2}}-\d{{2}})\b", re.I),
    "time": re.compile(r"\b(?:[01]?\d|2[0-3]):[0-5]\d\b"),
    "percent": re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*(?:%|percent\b)", re.I),
    "duration": re.compile(
        rf"(?<![\w.])(?:\d+(?:\.\d+)?|{_NUMBER_WORD})[\s-]*(?:second|minute|hour|day|week|month|year)s?\b(?![\s-]+long)",
        re.I,
    ),
    "count": re.compile(
        r"(?<![\w.])\d+\s*(?:character|review|device|user|seat|request|retr(?:y|ie)|attempt|run|replica|node|core)s?\b",
        re.I,
    ),
    "size": re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*(?:[KMGT]i?B|bytes?)\b"),
    "version": re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)?(?![\w.%])(?!\s*%)", re.I),
}
# Attributes that name no slot of their own.
_GENERIC_ATTRIBUTES = frozenset({"value", "statement", "status", "state", "note", "notes", "kind", "type"})
_STOP = frozenset(
    {
        "a", "an", "the", "of", "for", "to", "in", "on", "at", "by", "and", "or", "is", "are", "was", "were", "be",
        "been", "this", "that", "these", "those", "our", "its", "their", "it", "we", "your", "my", "his", "her",
        "with", "from", "as",
    }
)  # fmt: skip
_DETERMINERS = frozenset({"the", "a", "an", "every", "each", "all", "any", "no", "our", "this", "that", "its", "their"})
_PLAIN = frozenset({"the", "a", "an", "this", "that", "our"})  # before an attribute named plainly
# Number words as digits ("five seconds" is "5 seconds"); "a" and "an" stay words.
_NUMBERS = {word: str(n) for word, n in NUMBER_WORDS.items() if word not in ("a", "an")}
_NUMBER_WORDS = re.compile(r"\b(?:" + "|".join(_NUMBERS) + r")\b", re.I)
_WORD = re.compile(r"[a-z0-9][a-z0-9'\-]*")


class Held(NamedTuple):
    """A held fact's slot and value, as questioning reads it."""

    fact_id: str
    subject: str
    attribute: str
    value: str


@lru_cache(maxsize=8192)
def value_kinds(text: str) -> frozenset[str]:
    """The kinds of value `text` holds an expression of."""
    return frozenset(kind for kind in _KINDS if _expressions(kind, text))


def _expressions(kind: str, text: str) -> list[str]:
    """The expressions of a value of `kind` in `text`, lower-case; a duration inside a cadence ("every two
    weeks") is the cadence's."""
    found = list(_KINDS[kind].finditer(text))
    if kind == "duration" and found:
        cadences = [m.span() for m in _KINDS["cadence"].finditer(text)]
        found = [m for m in found if not any(a <= m.start() and m.end() <= b for a, b in cadences)]
    return [m.group(0).lower() for m in found]


def content_words(text: str) -> frozenset[str]:
    """Lower-case words of `text` without stop words, a plural's "s" taken off ("trains" is "train")."""
    return frozenset(_content_in_order(text))


def questions(sentence: str, held: Sequence[Held]) -> Held | None:
    """The one held fact `sentence` says changed without a value the rules read (see the module), or None."""
    if asks_or_hedges(sentence) or not _CUE.search(sentence):
        return None
    kinds = value_kinds(sentence)
    if not kinds:
        return None
    # Only a fact whose value is of a kind the sentence holds can fit: the rest are weighed only as other
    # subjects and attributes the sentence may name.
    valued = [fact for fact in held if kinds & value_kinds(fact.value)]
    if not valued:
        return None
    tokens = _tokens(sentence)
    present = frozenset(tokens)
    said = content_words(sentence)
    lowered = _digits(" ".join(sentence.lower().split()))
    subjects: dict[str, int] = {}
    named: dict[str, int] | None = None

    def subject_named(subject: str) -> int:
        if subject not in subjects:
            subjects[subject] = _names_subject(subject, said, tokens)
        return subjects[subject]

    fits: dict[tuple[str, str], tuple[int, Held]] = {}  # slot -> (how well the sentence names it, the fact)
    for fact in valued:
        at = _attribute_at(fact.attribute, tokens, present)
        if at >= 0:
            # The attribute named: with its subject, or plainly ("the observation window") where the sentence
            # names no other held subject in full ("the auth gateway's session TTL", "billing worker session TTL").
            plain = at == 0 or tokens[at - 1] in _PLAIN
            if not subject_named(fact.subject) and not (
                plain and not any(subject_named(o.subject) == 2 for o in held if o.subject != fact.subject)
            ):
                continue
            names = 2
        else:
            # The subject named alone: the sentence names no other attribute ("has its request timeout set at").
            names = subject_named(fact.subject)
            if not names:
                continue
            if named is None:
                attributes = {o.attribute for o in held} | set(ATTRIBUTES)
                named = {a: where for a in attributes if (where := _attribute_at(a, tokens, present)) >= 0}
            own = _surface_tokens(fact.attribute)
            if any(
                not any(_within(_surface_tokens(other), phrase) for phrase in own)
                for other in named
                if other != fact.attribute
            ):
                continue
        old = _digits(" ".join(fact.value.lower().split()))
        if old and old in lowered:
            continue  # the held value said again
        if any(_digits(e) not in old for kind in kinds & value_kinds(fact.value) for e in _expressions(kind, sentence)):
            fits.setdefault((fact.subject, fact.attribute), (names, fact))
    best = max((names for names, _ in fits.values()), default=0)
    likeliest = [fact for names, fact in fits.values() if names == best]
    return likeliest[0] if len(likeliest) == 1 else None


@lru_cache(maxsize=4096)
def _surface_tokens(attribute: str) -> tuple[tuple[str, ...], ...]:
    """The ways an attribute is written, each as `_tokens`: its own name and the rules' vocabulary for it; none
    for an attribute that names nothing ("value")."""
    if attribute.lower() in _GENERIC_ATTRIBUTES:
        return ()
    phrases = [attribute.replace("_", " "), *ATTRIBUTES.get(attribute, ())]
    return tuple(t for t in (tuple(_tokens(p)) for p in phrases) if t)


def _attribute_at(attribute: str, tokens: Sequence[str], present: frozenset[str]) -> int:
    """Where the sentence (`tokens`, their set `present`) first names `attribute` by one of its surfaces, or -1."""
    places = [i for phrase in _surface_tokens(attribute) if phrase[0] in present for i in _places(phrase, tokens)]
    return min(places, default=-1)


def _places(phrase: Sequence[str], tokens: Sequence[str]) -> list[int]:
    n = len(phrase)
    return [i for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n]) == tuple(phrase)]


def _within(inner: Sequence[Sequence[str]], outer: Sequence[str]) -> bool:
    """Whether some surface in `inner` is part of the phrase `outer` ("ttl" of "session ttl")."""
    return any(_places(phrase, outer) for phrase in inner)


def _digits(text: str) -> str:
    return _NUMBER_WORDS.sub(lambda m: _NUMBERS[m.group(0).lower()], text)


def _tokens(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower().replace("_", " "))]


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


@lru_cache(maxsize=4096)
def _content_in_order(text: str) -> tuple[str, ...]:
    """`content_words` in the order they are written (a subject's head is its last)."""
    return tuple(_stem(w) for w in _WORD.findall(text.lower().replace("_", " ")) if w not in _STOP)


def _names_subject(subject: str, said: frozenset[str], tokens: Sequence[str]) -> int:
    """2 when every content word of `subject` is in the sentence; 1 when its head (the last) is, after a word of
    the subject or a determiner ("every train" names "release trains"; "the payments service" does not name
    "auth service"); else 0."""
    words = _content_in_order(subject)
    if not words:
        return 0
    if set(words) <= said:
        return 2
    head = words[-1]
    return int(
        any(
            token == head and (i == 0 or tokens[i - 1] in _DETERMINERS or tokens[i - 1] in words)
            for i, token in enumerate(tokens)
        )
    )


def may_question(note: str) -> bool:
    """Whether some sentence of `note` could question a held fact: it states, says a change and holds a value
    (a cheap test before the facts are read)."""
    if not _CUE.search(note) or not any(pattern.search(note) for pattern in _KINDS.values()):
        return False
    return any(
        _CUE.search(s) and not asks_or_hedges(s) and any(pattern.search(s) for pattern in _KINDS.values())
        for s in sentences(note)
    )
