"""The checklist judge: success criteria read as checks over an output, scored 0-100 with the gaps named by criterion.

Deterministic and offline: PAIR's default judge and its fallback when the LLM
judge fails (`pvm.pair`). Each criterion is read into checks:

- a quoted phrase (``"rollback plan"``, ``'p99'`` or in backticks) must appear as it is;
- a number (``200 ms``, ``99.9%``, ``1,000``) must appear as a number;
- a bound on a number (``under 200 ms``, ``at least 3 replicas``, ``>= 99.9%``) is met by any
  number of the output on the right side of it, followed by the same unit word when one is named;
- ``at most N words`` / ``at least N words`` (also ``under``, ``no more than``,
  ``fewer than``, ``within``) bounds the output's length;
- every other content word must appear (compared by a crude stem, so ``plans`` meets ``plan``);
  words joined by ``or`` are alternatives (``Postgres or MySQL``: either will do);
- after a negation (``does not``, ``must not``, ``never``, ``no``, ``without``,
  ``avoid``...) the words that follow are forbidden: the output fails the check
  when it holds all of them (``does not mention the staging database``: both
  words together).

Words that only say what to do (``mention``, ``include``, ``state``...) and
stop words are not checks. A criterion's score is the share of its checks the
output passes; the output's score is the mean over criteria, rounded. A
criterion that yields no check at all (``Be helpful``) cannot be verified
offline: it scores 100 and is listed in `Verdict.unchecked`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from contracts.pair import Gap

_WORD = re.compile(r"[a-z0-9]+(?:[.,][0-9]+)*%?|[a-z0-9]+")
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|`([^`]+)`|(?<![a-z0-9])'([^']+)'(?![a-z0-9])")
_NUMBER = re.compile(r"^\d+(?:[.,]\d+)*%?$")
_LENGTH = re.compile(
    r"\b(at most|no more than|not more than|under|fewer than|less than|within|max(?:imum)?(?: of)?|at least|"
    r"no fewer than|min(?:imum)?(?: of)?)\s+(\d+)\s+words?\b"
)
_NEGATION = re.compile(
    r"\b(?:does not|doesn't|do not|don't|must not|mustn't|should not|shouldn't|may not|is not|are not|never|"
    r"not|no|without|avoids?|avoiding|excludes?|omits?)\b"
)
_LEAST = ("at least", "no fewer than", "min", "minimum", "min of", "minimum of")
# "under 200 ms", "at least 3 replicas", "> 99.9%": a bound on a number, met by any number on the right side of it
# (followed by the same unit word, when the criterion names one).
_BOUND = re.compile(
    r"(?:\b(under|below|less than|fewer than|at most|no more than|not more than|within|up to|max(?:imum)?|"
    r"above|over|more than|greater than|at least|no less than|exceeds?|min(?:imum)?)\b|(<=|>=|<|>))\s*"
    r"(\d+(?:[.,]\d+)*)\s*(%|[a-z]+)?"
)
_UPPER = frozenset(
    (
        "under",
        "below",
        "less than",
        "fewer than",
        "at most",
        "no more than",
        "not more than",
        "within",
        "up to",
        "max",
        "maximum",
        "<",
        "<=",
    )
)
_STRICT = frozenset(
    (
        "under",
        "below",
        "less than",
        "fewer than",
        "above",
        "over",
        "more than",
        "greater than",
        "exceed",
        "exceeds",
        "<",
        ">",
    )
)


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOP_WORDS = _word_set(
    """
    a an the and of to in on for with by at from as is are was were be been being it its that this these those
    must should shall will would can could may might need needs has have having had do does did done their
    there them they he she his her we our you your i me my which what how why when where who whom whose than
    then so such also both each every all any some into onto about over per via if else but yet just only very
    more most less least other another same own one ones clearly explicitly exactly properly correctly well
    briefly whether after before instead during while because since until
    """
)
# Words that say what to do with a term, not the term: "mentions the rollback plan" checks rollback and plan.
INSTRUCTION_WORDS = _word_set(
    """
    mention mentions mentioned mentioning include includes included including state states stated stating
    explain explains explained describe describes described list lists listed name names named give gives given
    provide provides provided cite cites cited say says said contain contains contained show shows shown
    specify specifies specified identify identifies identified note notes noted report reports reported quote
    quotes quoted answer response output text reply use uses using used refer refers reference references make
    makes ensure ensures
    """
)

# Qualities no word of the output shows: a criterion made only of these cannot be checked offline.
STYLE_WORDS = _word_set(
    """
    clear concise helpful accurate complete correct good specific polite professional brief short detailed
    thorough relevant readable consistent coherent friendly
    """
)


@lru_cache(maxsize=65_536)
def stem(word: str) -> str:
    """A crude stem, the same for the criterion and the output: plurals, -ing / -ed endings and a final e dropped.

    ``rotated``, ``rotates`` and ``rotate`` are all ``rotat``; ``cookies`` and ``cookie`` ``cooki``.
    """
    if _NUMBER.match(word):
        return number(word)
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "i"
    if len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith(("ed", "ses", "xes", "ches", "shes", "zes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if len(word) > 3 and word.endswith(("e", "y")):
        return word[:-1] + ("i" if word.endswith("y") else "")
    return word


def number(token: str) -> str:
    """A number token as one form: thousands separators and a trailing % or .0 dropped (``1,000.0%`` -> ``1000``)."""
    text = token.rstrip("%")
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", text):
        text = text.replace(",", "")
    text = text.replace(",", ".")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def words(text: str) -> list[str]:
    """The lower-cased word and number tokens of `text`, in order."""
    return _WORD.findall(text.lower())


def normalized(text: str) -> str:
    """`text` lower-cased with every run of non-word characters one space, for phrase matching."""
    return " " + " ".join(words(text)) + " "


@dataclass(frozen=True, slots=True)
class Check:
    """One check of a criterion: `kind` term (any of `stems`), phrase, number, forbidden (all of `stems`), length."""

    kind: str
    label: str  # how a gap names it
    stems: tuple[str, ...] = ()
    phrase: str = ""
    bound: int = 0  # length: the word limit (negative: at least that many)
    limit: float = 0.0  # a number bound: the value ...
    upper: bool = True  # ... the output's number must stay under (else over)
    strict: bool = False  # ... and may not equal
    unit: str = ""  # ... with this unit word after it ("" for any)


@dataclass(frozen=True, slots=True)
class Criterion:
    """A criterion and the checks read from it."""

    text: str
    checks: tuple[Check, ...]


@lru_cache(maxsize=1024)
def parse(criterion: str) -> Criterion:
    """The checks `criterion` asks for (see the module docstring)."""
    text = criterion.lower()
    checks: list[Check] = []
    for match in _LENGTH.finditer(text):
        limit = int(match.group(2))
        least = match.group(1) in _LEAST
        checks.append(
            Check("length", f"{'at least' if least else 'at most'} {limit} words", bound=-limit if least else limit)
        )
    text = _LENGTH.sub(" ", text)
    for match in _BOUND.finditer(text):
        word, op, value, unit = match.groups()
        how = word or op
        checks.append(
            Check(
                "bound",
                match.group(0).strip(),
                stems=(number(value),),
                limit=float(number(value)),
                upper=how in _UPPER,
                strict=how in _STRICT,
                unit="%" if unit == "%" else stem(unit) if unit and _content(unit) else "",
            )
        )
    text = _BOUND.sub(" ", text)
    negation = _NEGATION.search(text)
    cut = negation.start() if negation else len(text)
    for match in _QUOTED.finditer(criterion.lower()):
        quoted = next(g for g in match.groups() if g is not None)
        phrase = normalized(quoted)
        if phrase.strip():
            forbidden = negation is not None and match.start() > cut
            checks.append(
                Check("forbidden" if forbidden else "phrase", quoted.strip(), stems=tuple(words(quoted)), phrase=phrase)
            )
    text = _QUOTED.sub(" ", text)
    negation = _NEGATION.search(text)
    required, forbidden_part = (text[: negation.start()], text[negation.end() :]) if negation else (text, "")
    checks.extend(_term_checks(words(required)))
    banned = [w for w in words(forbidden_part) if _content(w)]
    if banned:
        checks.append(Check("forbidden", " ".join(banned), stems=tuple(stem(w) for w in banned)))
    return Criterion(criterion, tuple(checks))


def _content(word: str) -> bool:
    return (
        word not in STOP_WORDS
        and word not in INSTRUCTION_WORDS
        and word not in STYLE_WORDS
        and (len(word) > 1 or word.isdigit())
    )


def content_stems(text: str) -> frozenset[str]:
    """The stems of the words of `text` a check could be made of (no stop, instruction or style words)."""
    return frozenset(stem(w) for w in words(text) if _content(w))


def _term_checks(tokens: Sequence[str]) -> list[Check]:
    """One check per content word, numbers as number checks, ``X or Y`` as one check with alternatives."""
    groups: list[list[str]] = []
    joined = False
    for token in tokens:
        if token == "or":
            joined = bool(groups)
            continue
        if not _content(token):
            joined = False
            continue
        if joined and groups:
            groups[-1].append(token)
        else:
            groups.append([token])
        joined = False
    checks: list[Check] = []
    seen: set[tuple[str, ...]] = set()
    for group in groups:
        stems = tuple(dict.fromkeys(stem(w) for w in group))
        if stems in seen:
            continue
        seen.add(stems)
        if len(group) == 1 and _NUMBER.match(group[0]):
            checks.append(Check("number", group[0], stems=stems))
        else:
            checks.append(Check("term", " or ".join(group), stems=stems))
    return checks


@dataclass(frozen=True, slots=True)
class Output:
    """An output as the checks read it: its stems, its normalized text, its length in words."""

    stems: frozenset[str]
    text: str
    length: int
    numbers: tuple[tuple[float, str], ...]  # each number and the unit word after it ("%" for a percentage)

    @classmethod
    def read(cls, output: str) -> Output:
        tokens = words(output)
        numbers = []
        for i, token in enumerate(tokens):
            if _NUMBER.match(token):
                after = "%" if token.endswith("%") else stem(tokens[i + 1]) if i + 1 < len(tokens) else ""
                numbers.append((float(number(token)), after))
        return cls(frozenset(stem(w) for w in tokens), " " + " ".join(tokens) + " ", len(tokens), tuple(numbers))


def passes(check: Check, output: Output) -> bool:
    """Whether `output` passes `check`."""
    if check.kind == "phrase":
        return check.phrase in output.text
    if check.kind == "forbidden":
        if check.phrase:
            return check.phrase not in output.text
        return not all(s in output.stems for s in check.stems)
    if check.kind == "length":
        return output.length >= -check.bound if check.bound < 0 else output.length <= check.bound
    if check.kind == "bound":
        return any(_within(check, value) for value, unit in output.numbers if not check.unit or unit == check.unit)
    return any(s in output.stems for s in check.stems)  # term (alternatives) and number


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judgment: the score (0-100), the gaps by criterion, who judged, and why the configured judge did not."""

    score: int
    gaps: tuple[Gap, ...]
    judge: str
    fallback: str | None = None  # the LLM judge failed this round and the checklist judged instead: why
    unchecked: tuple[str, ...] = field(default=())  # criteria the checklist could not turn into any check


class ChecklistJudge:
    """Scores an output against criteria read as checks (the module docstring); the same answer every time."""

    name = "checklist"

    def judge(self, task: str, criteria: Sequence[str], output: str) -> Verdict:
        """The score and the gaps of `output` against `criteria` (`task` is not needed: the criteria say it all)."""
        read = Output.read(output)
        scores: list[float] = []
        gaps: list[Gap] = []
        unchecked: list[str] = []
        for criterion in criteria:
            parsed = parse(criterion)
            if not parsed.checks:
                unchecked.append(criterion)
                scores.append(1.0)
                continue
            failed = [c for c in parsed.checks if not passes(c, read)]
            share = 1.0 - len(failed) / len(parsed.checks)
            scores.append(share)
            if failed:
                gaps.append(
                    Gap(
                        criterion=criterion,
                        missing=tuple(_missing_label(c, read) for c in failed if c.kind != "forbidden"),
                        forbidden=tuple(c.label for c in failed if c.kind == "forbidden"),
                        score=round(100 * share),
                    )
                )
        score = round(100 * sum(scores) / len(scores)) if scores else 100
        return Verdict(score, tuple(gaps), self.name, unchecked=tuple(unchecked))


def _within(check: Check, value: float) -> bool:
    if check.upper:
        return value < check.limit or (not check.strict and value == check.limit)
    return value > check.limit or (not check.strict and value == check.limit)


def _missing_label(check: Check, output: Output) -> str:
    if check.kind == "length":
        return f"{check.label} (has {output.length})"
    return check.label
