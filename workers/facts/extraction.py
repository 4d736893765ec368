"""Fact extraction: the candidate facts a batch of minutes states, for the facts pool to dedupe and supersede.

An extractor turns minutes into `Candidate`s: a typed statement with a slot
(subject + attribute), a value, when it holds, its tier and the minutes that
state it. Every extractor implements `Extractor`. `RuleExtractor` is the
offline default: deterministic and pure (no I/O, no clock: relative dates
are grounded against each minute's own timestamp). Per minute, in order:

1. the structured convention: a minute whose ``data`` holds ``fact`` (or
   ``facts``, or a fact type as key) states exactly those facts, and its
   text is not read (`structured_facts`);
2. text rules over the memory note (and ``data.resolution`` / ``decision`` /
   ``lesson`` when they are text), sentence by sentence
   (`workers.rules.fact_text.read`); a plain statement in a ``decision`` or
   ``conflict_resolved`` minute is a decision, and a conflict's decision may
   supersede;
3. a ``task_failed`` minute with ``data.error`` (or ``reason``) and a task
   kind states a failure pattern of that kind of task.

Precision first: what the rules cannot read with confidence they drop, and
leave to the LLM extractor. docs/extraction.md has the tables.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from contracts import Minute
from contracts.fact_changes import LEARNED_SUBJECT
from contracts.facts import (
    MAX_FACT_TEXT,
    MAX_FACT_VALUE,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    FactType,
    Tier,
    default_single_valued,
    sentence_key,
)
from contracts.minute import iso_utc, parse_timestamp
from workers.rules.assessment import stated_text, task_kind
from workers.rules.fact_text import (
    ATTRIBUTES,
    clean_value,
    normalize_attribute,
    normalize_subject,
    parse_slot,
    prepare,
    read,
    sentences,
    value_key,
    vocabulary,
)
from workers.rules.open_slots import TIME_OF_DAY, lines, read_open, with_antecedent
from workers.rules.questioning import Held, content_words, questions
from workers.rules.relative_dates import day_of, day_start, ground_in_text
from workers.rules.statements import STATEMENT, reported, statements

__all__ = [
    "ATTRIBUTES",
    "DROPPED_RULES",
    "Candidate",
    "Extractor",
    "FactType",
    "Known",
    "RuleExtractor",
    "Tier",
    "clean_value",
    "normalize_attribute",
    "normalize_subject",
    "parse_slot",
    "reads_known",
    "resolve_open_slots",
    "structured_facts",
    "value_key",
]

# -- the tables -----------------------------------------------------------------------------

# Confidence of each rule's candidates (0..1); the rule names are `workers.rules.fact_text.Reading.rule`.
RULE_CONFIDENCE: dict[str, float] = {
    "data": 0.95,  # the structured convention: the producer said exactly what it means
    "constraint_must_not": 0.85,  # "X must not / must never / may not Y", "nobody may Y", "it is forbidden to Y"
    "constraint_must": 0.8,  # "X must (always) Y"
    "constraint_cannot": 0.7,  # "X cannot Y": often an ability, not a rule
    "constraint_imperative": 0.8,  # "never Y", "do not Y", "always Y"
    "procedure_purpose": 0.75,  # "to X, do Y", "how to X: Y"
    "procedure_trigger": 0.7,  # "when / if / whenever X, Y", "Y when X"
    "preference": 0.75,  # "we prefer X for T", "our preference for T is X", "X is preferred for T"
    "goal": 0.75,  # "the goal for S is to X", "goal for S: X", "S goal: X", "we aim to X on S"
    "decision": 0.85,  # "we decided to use X for S A", "switch S A from X to Y", "use Y instead of X for S A"
    "attribute": 0.8,  # "S's A is V", "the A of S is V", "S uses V as its A", "we set S A to V"
    "attribute_terse": 0.7,  # "S A: V", "S A = V"
    "tool": 0.75,  # "we use V for P", "P tool: V"
    "deadline": 0.8,  # "S is due D"
    "entity": 0.65,  # "X is a Y": the likeliest to be chatter
    "alias": 0.7,  # "X is also known as Y", "X aka Y"
    "failure": 0.6,  # a task_failed minute's data.error, for its kind of task
    # Open slots (workers.rules.open_slots): the slot is read from the sentence, not the vocabulary.
    "open_owner": 0.75,  # "S is owned by N", "N owns S", "S handed over to N"
    "open_label": 0.65,  # "Label: value", a list's item under its heading
    "open_change": 0.7,  # "S bumped to V", "we pinned S to V"
    "open_copula": 0.65,  # "the A of S is V", "S is V" where V names something
    "open_item": 0.6,  # a bare item of a list its heading introduces ("Devices:", "- Pixel 8")
    "open_due": 0.7,  # "S is done by 30 June"
    "open_within": 0.7,  # "S is revoked within 24 hours"
    "open_needs": 0.7,  # "every production change needs one approving review"
    "open_ready_by": 0.7,  # "the finance mart is fresh by 06:00 UTC every day"
    "open_cadence": 0.7,  # "S runs quarterly"
    "open_location": 0.7,  # "S now lives in V"
    "open_stays": 0.65,  # "S stays on V"
    "open_swap": 0.7,  # "swapping X for Y", "Y replaces X": the slot that holds X
    "open_added": 0.65,  # "adding X to the device matrix": one more value of the held list it names
    # A minute no rule reads a fact from: what its speaker says of themselves that lasts (workers.rules.statements).
    "statement": 0.6,
    # A sentence that says a held fact's slot changed, in words no rule reads (workers.rules.questioning): kept as a
    # statement beside the fact it questions, shown with it (at the promotion threshold: it retires nothing).
    "questions": 0.6,
}
# Rules the extractor does not run (the sentence then states nothing). "X cannot Y" read 0 of 26 facts right on the
# dev wording (bench/fact_sessions.py DEV_TEMPLATES: "I can't get X to start", "reviewer cannot join today"): it
# reports an ability, not a rule. bench/calibrate_rules.py adds any rule its wording finds wrong more often than not.
DROPPED_RULES: frozenset[str] = frozenset({"constraint_cannot"})
KNOWLEDGE_BONUS = 0.05  # a statement in a knowledge minute
DECISION_EVENT_BONUS = 0.05  # a plain statement made a decision by its minute or a "decision:" label
MAX_RULE_CONFIDENCE = 0.95

# data keys whose text is read besides the memory note.
TEXT_KEYS = ("resolution", "decision", "lesson")
# data keys of the structured convention: "fact"/"facts" (type inside, default by event) or a type name.
STRUCTURED_KEYS = ("fact", "facts", *(t.value for t in FactType if t is not FactType.FACT))
MAX_CAUSE_WORDS = 16  # a failure's data.error longer than this is a log line, not a pattern

_DECISION_EVENTS = frozenset({"decision", "conflict_resolved"})
_DATE_INTRO = re.compile(r"^(?:starting|from|as\s+of|since|effective|beginning)\s+", re.I)
_FACT_TYPES = frozenset(t.value for t in FactType)


def single_valued(type: FactType | str, attribute: str) -> bool:
    """Whether a newer value of this type in a slot with this attribute replaces the older one.

    The Fact contract's default (constraints and goals hold many values, and
    so do collection-like attributes such as owner, alias or failure_cause).
    """
    return bool(default_single_valued(type, attribute))


# -- the candidate ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fact an extractor read from minutes, before the facts pool dedupes, supersedes or promotes it.

    `type` is a `FactType` value and `tier` a `Tier` value (plain strings).
    `subject` and `attribute` are normalized (`normalize_subject`; attribute
    names from `ATTRIBUTES` or the type's own: preference, goal, action,
    must, must_not, kind, alias, tool, failure_cause, deadline); `value` is
    the stated value, cleaned (`clean_value`). `valid_from` is ISO 8601 UTC:
    the minute's timestamp, or the start of the day a relative date names.
    `tier` is "task" (then `task_id` is set) or "project", never "global":
    promotion is explicit.
    """

    type: str
    subject: str
    attribute: str
    value: str
    text: str
    confidence: float
    valid_from: str
    tier: str
    project_id: str
    task_id: str | None = None
    tags: tuple[str, ...] = ()
    source_minute_ids: tuple[str, ...] = ()
    single_valued: bool = True
    supersedes_hint: bool = False
    rule: str = ""  # which rule read it (a RULE_CONFIDENCE key), or "llm"
    # The known fact (same tier key and slot) the statement replaces, when an extractor was shown it and named it.
    supersedes_fact_id: str | None = None
    # The old value a statement names as replaced, its slot unnamed ("swapping X for Y"): `resolve_open_slots` finds
    # the slot that holds X, or drops the candidate.
    replaces_value: str | None = None
    # The held fact (same tier key) this statement says changed without a value the rules read
    # (`questioning_candidates`): the fact relates to it as `RelationKind.QUESTIONS`.
    questions_fact_id: str | None = None

    @property
    def slot(self) -> tuple[str, str]:
        """(subject, attribute): what the fact is about; a newer value in the same slot may supersede it."""
        return (self.subject, self.attribute)


# Existing facts per slot, for extractors that weigh a statement against them (the rules do not).
Known = Mapping[tuple[str, str], Sequence[Any]]


class Extractor(Protocol):
    """Anything that turns minutes into candidate facts: the rules, an LLM, a test double.

    An extractor that weighs statements against existing facts sets a class attribute ``reads_known = True``;
    the facts pool then reads the current facts of a batch's tier keys and passes them as `known`
    (`reads_known`). The rules do not, and their batches skip that read.
    """

    def extract(self, minutes: Sequence[Minute], known: Known | None = None) -> list[Candidate]: ...


def reads_known(extractor: object) -> bool:
    """Whether `extractor` wants the existing facts of its minutes' slots (``reads_known = True`` on it)."""
    return getattr(extractor, "reads_known", False) is True


# -- the structured convention ------------------------------------------------------------


def structured_facts(minute: Minute) -> list[dict[str, Any]]:
    """The fact objects a minute's data states by the convention (docs/extraction.md), each with its type.

    ``data.fact`` (an object or a list), ``data.facts`` (a list), or a fact
    type as key (``data.decision``, ``data.constraint``, ...) holding an
    object or a list. An object's type is its ``type``, else the key's, else
    decision in a decision or conflict_resolved minute and fact elsewhere.
    Text under those keys is not the convention (it is read as text).
    """
    out: list[dict[str, Any]] = []
    default = FactType.DECISION if minute.event_type in _DECISION_EVENTS else FactType.FACT
    for key in STRUCTURED_KEYS:
        raw = minute.data.get(key)
        items = raw if isinstance(raw, list) else [raw] if isinstance(raw, dict) else []
        key_type = None if key in ("fact", "facts") else key
        for item in items:
            if isinstance(item, dict):
                out.append({**item, "type": item.get("type") or key_type or default.value})
    return out


# -- the extractor -------------------------------------------------------------------------


class RuleExtractor:
    """The deterministic extractor: the same minutes give the same candidates, on any machine, at any time."""

    def __init__(
        self,
        attributes: Mapping[str, Sequence[str]] | None = None,
        *,
        run_dropped: bool = False,
        statements: bool = True,
    ) -> None:
        """`attributes` adds to (or overrides) `ATTRIBUTES`: canonical name -> the phrases that name it.

        `run_dropped` reads with the `DROPPED_RULES` too (for calibration: what they would say). `statements`:
        a minute no rule reads a fact from keeps what its speaker says of themselves that lasts
        (`workers.rules.statements`).
        """
        self._vocabulary = vocabulary({**ATTRIBUTES, **attributes}) if attributes else None
        self._dropped = frozenset() if run_dropped else DROPPED_RULES
        self._statements = statements

    def extract(self, minutes: Sequence[Minute], known: Known | None = None) -> list[Candidate]:
        """The candidates `minutes` state, in minute order; `known` is not used by the rules."""
        out: list[Candidate] = []
        for minute in minutes:
            out.extend(self.from_minute(minute))
        return out

    def from_minute(self, minute: Minute) -> list[Candidate]:
        """The candidates one minute states, each (type, slot, value) once."""
        at = parse_timestamp(minute.timestamp)
        structured = structured_facts(minute)
        if structured:
            found = [c for c in (self._from_data(minute, at, item) for item in structured) if c is not None]
        else:
            found = self._from_text(minute, at)
            failure = self._failure(minute, at)
            if failure is not None:
                found.append(failure)
            if not found and self._statements:
                found = self._said(minute, at)
        unique: dict[tuple[str, str, str, str], Candidate] = {}
        for c in found:
            unique.setdefault((c.type, c.subject, c.attribute, value_key(c.value)), c)
        return list(unique.values())

    def from_object(self, minute: Minute, item: Mapping[str, Any]) -> Candidate | None:
        """A candidate from one fact object shaped like the data convention, as `minute` states it; None if unfit.

        The convention's rules in one place: the LLM extractor reads its
        answer's items with it (normalized slot, cleaned value, grounded dates,
        the contract's limits).
        """
        return self._from_data(minute, parse_timestamp(minute.timestamp), item)

    def _from_text(self, minute: Minute, at: datetime) -> list[Candidate]:
        out: list[Candidate] = []
        for raw in (minute.memory_note, *(minute.data.get(k) for k in TEXT_KEYS)):
            text = stated_text(raw)
            if text is None:
                continue
            before: str | None = None  # the subject the sentence before was read about
            for line in lines(text):
                sentence = line.text
                if before:
                    sentence = with_antecedent(sentence, before)  # "It is owned by Dana": the thing just named
                    line = line._replace(text=sentence)
                prepared = prepare(sentence, minute, at)
                if prepared is None:
                    before = None
                    continue
                reading = read(sentence, minute, at, self._vocabulary, prepared=prepared)
                readings = (
                    [reading]
                    if reading is not None
                    else read_open(line, minute, at, self._vocabulary, prepared=prepared)
                )
                before = readings[0].subject if readings else None
                for reading in readings:
                    if reading.rule in self._dropped:
                        continue
                    type_, confidence = reading.type, RULE_CONFIDENCE[reading.rule]
                    if type_ is FactType.FACT and (reading.decision_label or minute.event_type in _DECISION_EVENTS):
                        type_, confidence = FactType.DECISION, confidence + DECISION_EVENT_BONUS
                    if minute.event_type == "knowledge":
                        confidence += KNOWLEDGE_BONUS
                    supersedes = reading.supersedes or (
                        type_ is FactType.DECISION and minute.event_type == "conflict_resolved"
                    )
                    candidate = self._candidate(
                        minute,
                        at,
                        type_=type_,
                        subject=reading.subject,
                        attribute=reading.attribute,
                        value=reading.value,
                        text=_sentence_text(sentence),
                        confidence=confidence,
                        valid_from=day_start(reading.valid_from) if reading.valid_from else None,
                        supersedes=supersedes,
                        rule=reading.rule,
                        single=reading.single_valued,
                        replaces=reading.replaces,
                    )
                    if candidate is not None:
                        out.append(candidate)
        return out

    def _said(self, minute: Minute, at: datetime) -> list[Candidate]:
        """What the minute's speaker says of themselves that lasts (`workers.rules.statements`): each sentence a
        value of the speaker's `STATEMENT` slot, one of many."""
        text = stated_text(minute.memory_note)
        if text is None:
            return []
        who, said = reported(text)
        speaker = normalize_subject(who or minute.agent_id or "")
        if not speaker:
            return []
        out = []
        for sentence in statements(said):
            candidate = self._candidate(
                minute,
                at,
                type_=FactType.FACT,
                subject=speaker,
                attribute=STATEMENT,
                value=sentence,
                text=f"{who or minute.agent_id} said: {_sentence_text(sentence)}",
                confidence=RULE_CONFIDENCE["statement"],
                valid_from=None,
                supersedes=False,
                rule="statement",
                single=False,
            )
            if candidate is not None:
                out.append(candidate)
        return out

    def _from_data(self, minute: Minute, at: datetime, item: Mapping[str, Any]) -> Candidate | None:
        """A candidate from one object of the convention; None when it lacks a subject, attribute or value."""
        type_ = item.get("type")
        subject = item.get("subject", item.get("condition"))
        value = item.get("value", item.get("action"))
        attribute = item.get("attribute", "action" if "condition" in item else None)
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (int, float)):
            value = str(value)
        if (
            not isinstance(type_, str)
            or type_ not in _FACT_TYPES
            or not all(_text(x) for x in (subject, attribute, value))
        ):
            return None
        assert isinstance(subject, str) and isinstance(attribute, str) and isinstance(value, str)
        subject = normalize_subject(subject)
        attribute = normalize_attribute(attribute, self._vocabulary) or re.sub(
            r"[^0-9a-z]+", "_", attribute.lower()
        ).strip("_")
        if attribute == "deadline" or type_ == FactType.GOAL:
            value = ground_in_text(value, at)
        confidence = item.get("confidence")
        if not isinstance(confidence, (int, float)) or isinstance(confidence, bool):
            confidence = RULE_CONFIDENCE["data"]
        single = item.get("single_valued")
        text = item.get("text")
        tier = item.get("tier")
        return self._candidate(
            minute,
            at,
            type_=FactType(type_),
            subject=subject,
            attribute=attribute,
            value=value,
            text=text
            if isinstance(text, str) and text.strip()
            else f"{subject} {attribute.replace('_', ' ')}: {value}.",
            confidence=float(confidence),
            valid_from=_stated_valid_from(item.get("valid_from"), at),
            supersedes=item.get("supersedes") is True,
            rule="data",
            single=single if isinstance(single, bool) else None,
            tier=tier if tier in (Tier.TASK, Tier.PROJECT) else None,
        )

    def _failure(self, minute: Minute, at: datetime) -> Candidate | None:
        """A failure pattern: a task_failed minute's error, for the kind of task that failed."""
        if minute.event_type != "task_failed":
            return None
        cause = stated_text(minute.data.get("error")) or stated_text(minute.data.get("reason"))
        kind = task_kind(minute)
        if not cause or not kind or len(cause.split()) > MAX_CAUSE_WORDS:
            return None
        return self._candidate(
            minute,
            at,
            type_=FactType.FACT,
            subject=normalize_subject(kind),
            attribute="failure_cause",
            value=cause,
            text=f"{kind} tasks have failed because: {cause}.",
            confidence=RULE_CONFIDENCE["failure"],
            valid_from=None,
            supersedes=False,
            rule="failure",
            tier=Tier.PROJECT,
        )

    def _candidate(
        self,
        minute: Minute,
        at: datetime,
        *,
        type_: FactType,
        subject: str,
        attribute: str,
        value: str,
        text: str,
        confidence: float,
        valid_from: str | None,
        supersedes: bool,
        rule: str,
        single: bool | None = None,
        tier: str | None = None,
        replaces: str | None = None,
    ) -> Candidate | None:
        """The candidate, or None where the Fact contract would refuse it (learn()'s subject, an oversized value)."""
        task_id = stated_text(minute.data.get("task_id"))
        value = clean_value(value)
        if subject == LEARNED_SUBJECT or not value or len(value) > MAX_FACT_VALUE:
            return None  # learn() owns that subject; a value over the limit would be refused as a fact
        if tier is None:
            tier = Tier.TASK if minute.scope == "task" or subject == "task" else Tier.PROJECT
        if not task_id:
            tier = Tier.PROJECT  # a task tier needs its task: without one the fact is the project's
        kind = task_kind(minute)
        tags = [f"kind:{kind}"] if kind else []
        stated_tags = minute.data.get("tags")
        if isinstance(stated_tags, list):
            tags += [t for t in stated_tags if isinstance(t, str) and t and len(t) <= MAX_TAG_LENGTH]
        return Candidate(
            type=type_.value,
            subject=subject,
            attribute=attribute,
            value=value,
            text=text[:MAX_FACT_TEXT],
            confidence=round(min(MAX_RULE_CONFIDENCE, max(0.0, confidence)), 3),
            valid_from=valid_from or _utc_iso(at),
            tier=Tier(tier).value,
            project_id=minute.project_id,
            task_id=task_id if tier == Tier.TASK else None,
            tags=tuple(dict.fromkeys(tags))[:MAX_TAGS],
            source_minute_ids=(minute.id,),
            single_valued=single_valued(type_, attribute) if single is None else single,
            supersedes_hint=supersedes,
            rule=rule,
            replaces_value=replaces,
        )


def resolve_open_slots(candidates: Sequence[Candidate], held: Known) -> list[Candidate]:
    """Candidates of open slots that say they change a value or add one to a list, each moved into the slot it
    changes.

    An open slot is named as a sentence names it, so one thing said two ways is two slots: "Raj owns customers"
    (customers, owner) and "the customers domain is handed over to Ines" (customers domain, owner). A candidate that
    adds a value to a list (`rule` ``open_added``) takes the held list slot its words name (`_named_list`). A
    candidate read by an open rule (`rule` ``open_*``) that hints it replaces a value, whose own slot holds nothing,
    takes the one slot that has its attribute, holds a single value, and whose subject's words hold all of its
    subject's words or are all held by them: among the facts `held` (the current view of its tier keys, slot ->
    facts) and the candidates before it (`candidates` are in minute order). A candidate that names only the value it
    replaces (`replaces_value`: "swapping X for Y") takes the one single-valued slot holding X, or is dropped. Where
    several or none fit, it stays where it was said: never on topic overlap alone, the attribute must be the same
    (or the old value named) and the change said.
    """
    slots: dict[tuple[str, str], set[str]] = {}  # slot -> projects where it holds one value
    holding: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (project, value key) -> slots holding that value
    lists: dict[str, set[tuple[str, str]]] = {}  # project -> slots holding many values (not statements)
    values: dict[tuple[str, str, str], str] = {}  # (project, subject, attribute) -> the single value it holds
    for (subject, attribute), facts in held.items():
        for f in facts:
            if f.single_valued and f.tier_key.project_id:
                slots.setdefault((subject, attribute), set()).add(f.tier_key.project_id)
                values[(f.tier_key.project_id, subject, attribute)] = f.value
                holding.setdefault((f.tier_key.project_id, value_key(f.value)), set()).add((subject, attribute))
            elif not f.single_valued and f.tier_key.project_id and attribute != STATEMENT:
                lists.setdefault(f.tier_key.project_id, set()).add((subject, attribute))
    out: list[Candidate] = []
    for c in candidates:
        if c.rule == "open_added":
            # "Adding X to the device matrix": the held list the sentence names, if exactly one fits best.
            fit = _named_list(c.subject, lists.get(c.project_id, set()))
            if fit is not None:
                c = dataclasses.replace(c, subject=fit[0], attribute=fit[1])
        if c.replaces_value is not None:
            places = holding.get((c.project_id, value_key(c.replaces_value)), set())
            if len(places) != 1:
                continue  # the replaced value is held nowhere (or in several slots): nothing to change
            subject, attribute = next(iter(places))
            c = dataclasses.replace(c, subject=subject, attribute=attribute, replaces_value=None)
        elif c.supersedes_hint and c.rule.startswith("open_") and c.project_id not in slots.get(c.slot, ()):
            words = content_words(c.subject)  # "workforce password minimum" holds "workforce passwords"
            fits = [
                slot
                for slot, projects in slots.items()
                if _same_attribute(c.attribute, slot[1])
                and slot[0] != c.subject
                and c.project_id in projects
                and (words <= content_words(slot[0]) or content_words(slot[0]) <= words)
            ]
            if len(fits) == 1:
                subject, attribute = fits[0]
                value = _with_time(c.value, values.get((c.project_id, subject, attribute), ""))
                c = dataclasses.replace(c, subject=subject, attribute=attribute, value=value)
        if c.single_valued:
            slots.setdefault(c.slot, set()).add(c.project_id)
            values[(c.project_id, *c.slot)] = c.value
            holding.setdefault((c.project_id, value_key(c.value)), set()).add(c.slot)
        elif c.attribute != STATEMENT:
            lists.setdefault(c.project_id, set()).add(c.slot)
        out.append(c)
    return out


# Attributes that name the same slot as the last word of another ("the finance SLA" is its "freshness deadline").
_ATTRIBUTE_HEADS = {"sla": "deadline", "cutoff": "deadline", "due time": "deadline", "limit": "deadline"}
_TIME = re.compile(rf"\b{TIME_OF_DAY}", re.I)


def _same_attribute(said: str, held: str) -> bool:
    """Whether an attribute a change names is the held slot's: the same words, or a word for its head ("sla" for
    "freshness deadline")."""
    return said == held or _ATTRIBUTE_HEADS.get(said) == held.split()[-1]


def _with_time(value: str, held: str) -> str:
    """A change that gives only a time of day keeps the rest of the held value: "relaxes to 07:00 UTC" of "06:00 UTC
    daily" is "07:00 UTC daily"; any other value is as said."""
    times = _TIME.findall(held)
    if len(times) != 1 or _TIME.fullmatch(value.strip()) is None or held.strip() == times[0]:
        return value
    return held.replace(times[0], value.strip(), 1)


# Words that say a phrase is a list, not what it lists ("this year's review list").
_LIST_WORDS = frozenset({"list", "lists", "set", "roster", "register", "member", "members"})


def _named_list(phrase: str, lists: set[tuple[str, str]]) -> tuple[str, str] | None:
    """The list slot (subject, attribute) among `lists` a phrase names: every word of the phrase (list words
    aside) in its subject and attribute, else the most of them, and of several, the one whose subject the phrase
    names whole; None where none or several fit best."""
    words = {w for w in content_words(phrase) if w not in _LIST_WORDS}
    if not words:
        return None
    scored = [(len(words & content_words(f"{s} {a}")), (s, a)) for s, a in sorted(lists)]
    whole = [slot for n, slot in scored if n == len(words)]
    if whole:
        return whole[0] if len(whole) == 1 else None
    best = max((n for n, _ in scored), default=0)
    fits = [slot for n, slot in scored if n == best]
    if len(fits) > 1:  # "the audit scope": the audit's list, not one that merely says "scope"
        fits = [slot for slot in fits if content_words(slot[0]) <= words]
    return fits[0] if best and len(fits) == 1 else None


def questioning_candidates(minutes: Sequence[Minute], candidates: Sequence[Candidate], held: Known) -> list[Candidate]:
    """Statements that question held facts: a sentence of a minute that says a held fact's slot changed in words
    no rule read (`workers.rules.questioning.questions`), kept as a value of the fact's subject's `STATEMENT`
    slot in the fact's tier key, relating to it (`questions_fact_id`).

    `held` is the current view after `candidates` were decided (slot -> facts). A sentence a candidate was read
    from questions nothing (the rules read it), and neither does one whose likeliest slot is one its minute
    stated, or whose fact is not older than the minute or has it among its sources. The facts weighed are
    those of the minute's tier keys (its project, and its task). Minutes with structured facts state them as
    data: they question nothing. Each fact is questioned once per minute. The pool passes only the minutes
    that may question anything (`workers.rules.questioning.may_question`), before it reads `held`.
    """
    read: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (project, minute id) -> slots read from it
    texts: dict[tuple[str, str], set[str]] = {}  # (project, minute id) -> the sentences read
    for c in candidates:
        for minute_id in c.source_minute_ids:
            read.setdefault((c.project_id, minute_id), set()).add(c.slot)
            texts.setdefault((c.project_id, minute_id), set()).add(sentence_key(c.text))
    facts = [f for facts in held.values() for f in facts if f.attribute != STATEMENT]
    out: list[Candidate] = []
    for minute in minutes:
        note = stated_text(minute.memory_note)
        if note is None or structured_facts(minute):
            continue
        at = parse_timestamp(minute.timestamp)
        task_id = stated_text(minute.data.get("task_id"))
        mine = {
            f.id: f
            for f in facts
            if f.tier_key.project_id == minute.project_id
            and (f.tier_key.task_id is None or f.tier_key.task_id == task_id)
        }
        if not mine:
            continue
        key = (minute.project_id, minute.id)
        rows = [Held(f.id, f.subject, f.attribute, f.value) for f in mine.values()]
        seen: set[str] = set()
        for sentence in sentences(note):
            text = _sentence_text(sentence.rstrip(" ;,:"))
            if sentence_key(text) in texts.get(key, ()) or len(text) > MAX_FACT_VALUE:
                continue
            fit = questions(sentence, rows)
            if fit is None or fit.fact_id in seen:
                continue
            target = mine[fit.fact_id]
            if (
                (target.slot.subject, target.slot.attribute) in read.get(key, ())
                or minute.id in target.source_minute_ids
                or parse_timestamp(target.valid_from) >= at
            ):
                continue
            seen.add(target.id)
            out.append(
                Candidate(
                    type=FactType.FACT.value,
                    subject=target.subject,
                    attribute=STATEMENT,
                    value=text,
                    text=text[:MAX_FACT_TEXT],
                    confidence=RULE_CONFIDENCE["questions"],
                    valid_from=_utc_iso(at),
                    tier=target.tier_key.tier.value,
                    project_id=minute.project_id,
                    task_id=target.tier_key.task_id,
                    source_minute_ids=(minute.id,),
                    single_valued=False,
                    rule="questions",
                    questions_fact_id=target.id,
                )
            )
    return out


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _stated_valid_from(stated: object, at: datetime) -> str | None:
    """A convention object's valid_from: a relative date phrase or an ISO 8601 timestamp; anything else is ignored."""
    if not isinstance(stated, str) or not stated.strip():
        return None
    day = day_of(_DATE_INTRO.sub("", stated.strip()), at)
    if day is not None:
        return day_start(day)
    try:
        return _utc_iso(parse_timestamp(stated))
    except ValueError:  # InvalidMinute is a ValueError: an unreadable time is no time
        return None


def _sentence_text(sentence: str) -> str:
    text = " ".join(sentence.split())
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!")) else text + "."


def _utc_iso(at: datetime) -> str:
    return iso_utc(at)
