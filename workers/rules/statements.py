"""Statements: what someone says about themselves that lasts, kept as knowledge when no slot can be read from it.

The slot rules (`workers.rules.fact_text`, `workers.rules.open_slots`) read
a typed fact where a sentence names a thing and a value. Much of what people
say that is worth remembering has no such shape: "I adopted a puppy last
week", "We've been going to the lake every summer since the kids were
small", "My sister started a bakery in March". Such a sentence is kept as
it was said, as a fact in the speaker's `STATEMENT` slot (one of many): the
speaker is the subject, the sentence the value, so the context shows it
under what we know and search and time travel read it like any fact.

A sentence is a statement (`is_statement`) when it is a declarative of at
least `MIN_STATEMENT_WORDS` words whose subject is the speaker ("I", "we",
or "my X" / "our X" before a verb), and it says what happened or what
holds: a past tense or a time phrase ("last week", "since 2019", "for three
years", "next month"), or a lasting state or habit in the present ("I love
hiking", "I'm learning Spanish", "we volunteer at the shelter"). Questions, thanks,
encouragement, feelings about the listener and small talk are not
statements, however they are punctuated. Pure functions of the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

STATEMENT = "statement"  # the attribute of a speaker's statements (many values: `contracts.facts`)
MIN_STATEMENT_WORDS = 6
MAX_STATEMENTS_PER_MINUTE = 3

# "Caroline said, "…"" (and LoCoMo's "… and shared a photo of …" after the quote): who speaks, and what.
_REPORTED = re.compile(
    r"^(?P<who>[A-Z][\w.'\-]*(?:\s+[A-Z][\w.'\-]*){0,2})\s+(?:said|says|wrote|writes|replied|added),?\s*"
    r"[\"\u201c](?P<said>.+?)[\"\u201d]\s*(?:and\s+shared\s+.*)?$",
    re.S,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"\u201d\u2019)]*\s+")
# What is said to the listener or about the talk, not about the speaker's life.
_TO_THE_LISTENER = re.compile(
    r"\b(?:thank(?:s|\s+you)?|appreciate|grateful|glad\s+(?:you|to\s+hear)|happy\s+for\s+you|proud\s+of\s+you"
    r"|can'?t\s+wait|cannot\s+wait|hope\s+you|agree|bye|take\s+care|see\s+you|talk\s+soon|sounds|congrat\w*"
    r"|you'?re|you\s+are|you\s+should|you\s+can|you\s+got\s+this|keep\s+(?:it|at|up|going)|good\s+luck"
    r"|let\s+me\s+know|let'?s|nice\s+to|great\s+to|good\s+to|wish\s+you|miss\s+you|love\s+you)\b",
    re.I,
)
# A time phrase: the statement says when, or for how long.
_WHEN = re.compile(
    r"\b(?:yesterday|ago|recently|lately|since|anymore|first\s+time"
    r"|(?:last|next|this|every|each)\s+(?:week|weekend|month|year|night|summer|fall|autumn|spring|winter|time"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday|morning|evening)"
    r"|for\s+(?:\w+\s+)?(?:days|weeks|months|years|decades)|(?:19|20)\d\d|in\s+(?:january|february|march|april"
    r"|may|june|july|august|september|october|november|december))\b",
    re.I,
)
# What holds for the day or the hour only, or what someone needs or means to do: no lasting statement.
_PASSING = re.compile(
    r"\b(?:today|tonight|tomorrow|right\s+now|this\s+(?:morning|afternoon|evening)|(?:i|we)\s+(?:need|have)\s+to"
    r"|(?:i|we)'ll|(?:i|we)\s+will|(?:i|we)'d\s+rather|(?:i|we)\s+would\s+rather)\b",
    re.I,
)
# A past tense or an event verb.
_EVENT = re.compile(
    r"\b(?:\w{3,}ed|went|got|took|made|found|joined|bought|had|was|were|saw|did|ran|won|began|met|gave|came|left"
    r"|wrote|read|built|moved|adopted|started|finished|taught|caught|drew|grew|held|kept|lost|sold|spent|told"
    r"|thought|felt|became|brought|chose|flew|fell|forgot|heard|knew|led|paid|rode|sang|sat|slept|spoke|stood"
    r"|swam|threw|understood|wore|been|gone)\b",
    re.I,
)
# Past-tense words that say how the speaker feels about the talk, not what happened.
_NOT_EVENTS = frozenset({"interested", "excited", "amazed", "thrilled", "pleased", "tired", "surprised", "inspired"})


def to_the_listener(sentence: str) -> bool:
    """Whether a sentence is said to the listener or about the talk (thanks, encouragement, "sounds great")."""
    return _TO_THE_LISTENER.search(sentence) is not None


def reported(note: str) -> tuple[str | None, str]:
    """(who speaks, what they say) of a note written as reported speech; (None, the note) for any other note."""
    match = _REPORTED.match(note.strip())
    if match is None:
        return None, note
    return match.group("who"), match.group("said")


def statements(text: str) -> Iterator[str]:
    """The sentences of `text` that are statements (`is_statement`), at most `MAX_STATEMENTS_PER_MINUTE`."""
    found = 0
    for sentence in _SENTENCE_END.split(text.strip()):
        sentence = " ".join(sentence.split()).strip("\"'\u201c\u201d ")
        if found < MAX_STATEMENTS_PER_MINUTE and is_statement(sentence):
            found += 1
            yield sentence


# The speaker is who did or holds it: "I" or "we" as a subject, or "my X" / "our X" before a verb.
_SPEAKER = re.compile(
    r"\b(?:i|i'm|i've|i'd|im|ive|we|we're|we've|we'd)\b"
    r"|\b(?:my|our)\s+(?:\w+\s+)?(?:\w+ed|is|are|was|were|has|have|had|loves?|likes?|went|got|made|took|gave)\b",
    re.I,
)
# A lasting state or habit of the speaker's, said in the present: "I love hiking", "I'm a big fan of pottery",
# "we volunteer at the shelter", "I'm learning Spanish".
_STATE = re.compile(
    r"\b(?:i|we)(?:'m|'re|\s+am|\s+are)?\s+(?:(?:really|just|also|still|always|usually|often|currently|now)\s+)?"
    r"(?:love|like|enjoy|prefer|adore|work|live|volunteer|play|study|teach|practice|practise|paint|write|cook|collect"
    r"|own|have\s+(?:a|an|two|three|some|been)|a\s+(?:big\s+|huge\s+)?fan\s+of|into|learning|taking|creating|working"
    r"|planning|writing|training|studying|building|volunteering|saving|trying\s+to)\b(?!\s+(?:your|you|that|it|this"
    r"|how\s+you|what\s+you))",
    re.I,
)


def is_statement(sentence: str) -> bool:
    """Whether a sentence says, in the first person, something that happened to the speaker or holds for them."""
    words = sentence.split()
    if len(words) < MIN_STATEMENT_WORDS or sentence.rstrip("\"'\u201d)").endswith("?"):
        return False
    if not _SPEAKER.search(sentence) or _TO_THE_LISTENER.search(sentence) or _PASSING.search(sentence):
        return False
    if _WHEN.search(sentence) or _STATE.search(sentence):
        return True
    return any(m.group(0).lower() not in _NOT_EVENTS for m in _EVENT.finditer(sentence))


# -- in the third person ---------------------------------------------------------------------------------------

_MODALS = frozenset(
    {"can", "could", "will", "would", "should", "shall", "might", "must", "may", "did", "didn't", "can't", "won't"}
)  # fmt: skip
_THIRD = {"am": "is", "have": "has", "do": "does", "go": "goes", "'m": "is", "'ve": "has", "'ll": "will"}
_ADVERBS = frozenset({"just", "also", "still", "really", "never", "always", "even", "actually", "finally", "recently"})
_FIRST_PERSON = re.compile(r"\b(I'm|I've|I'll|I'd|I|my|mine|myself|me)\b")


def in_third_person(who: str, sentence: str) -> str | None:
    """What `who` said of themselves, said of them: "I went camping last week" is "Caroline went camping last
    week", "my sister started a bakery" is "Caroline's sister started a bakery". None when the sentence does not
    start with the speaker ("I", "I'm", "my ...") or a verb after "I" could not be put in the third person."""
    words = sentence.split()
    if not words or words[0] not in ("I", "I'm", "I've", "I'll", "My", "my"):
        return None
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        bare = word.rstrip(",.;:!")
        tail = word[len(bare) :]
        if bare in ("I'm", "I've", "I'll"):
            out.append(f"{who} {_THIRD[bare[1:]]}{tail}")
        elif bare == "I":
            out.append(who)
            j = i + 1
            while j < len(words) and words[j].lower() in _ADVERBS:
                out.append(words[j])
                j += 1
            if j < len(words):
                verb = words[j].rstrip(",.;:!")
                third = _third_person_verb(verb)
                if third is None:
                    return None
                out.append(third + words[j][len(verb) :])
                i = j
        elif bare in ("my", "My"):
            out.append(f"{who}'s{tail}" if not out else f"their{tail}")
        elif bare in ("me", "myself", "mine"):
            out.append({"me": "them", "myself": "themselves", "mine": "theirs"}[bare] + tail)
        elif bare in ("I'd",):
            return None  # "would" or "had": not said which
        else:
            out.append(word)
        i += 1
    return " ".join(out)


def _third_person_verb(verb: str) -> str | None:
    low = verb.lower()
    if low in _MODALS or _EVENT.fullmatch(low):  # a past tense stays as it is
        return verb
    if low in _THIRD:
        return _THIRD[low]
    if not low.isalpha():
        return None
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if low.endswith("y") and low[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"
