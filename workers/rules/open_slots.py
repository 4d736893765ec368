"""Open slots: what prose states about a thing that no phrase of `ATTRIBUTES` names.

The closed rules (`workers.rules.fact_text.read`) read a slot only when its
attribute is in the vocabulary. People write about anything: "Compliance
platform: Vanta.", "CC6.1 is owned by Sam Whitfield.", "Deployment target
moved to iOS 16.", "Supported locales: en-US, de-DE and ja-JP." These rules
read such statements with the slot taken from the sentence itself, in the
shapes where English says plainly that a thing has a value:

- a labelled line, ``Label: value`` (under a list's heading the heading is
  the subject: ``SOC 2 programme:`` then ``• Auditor: Prescott & Lang LLP``);
- a definite copula, ``the A of S is V`` / ``S is V`` where V names something
  (a capitalized word, a number, an identifier), and its inverse ``V is the
  A of S``;
- ownership: ``S is owned by N``, ``N owns S``, ``S handed over to N``;
- a change verb from a lexicon (`CHANGE_VERBS`: bumped, moved, pinned,
  tightened, ...): ``S A bumped to V``, ``we pinned S to V``, ``S goes to V``;
  these supersede the slot's value;
- a time limit, ``S is <done> within N <unit>`` ("a leaver's access is
  revoked within 24 hours"): a constraint in the slot of what is done
  ("revocation deadline"); ``..., not M`` after it names the limit it
  replaces;
- a time of day, ``S is fresh (ready, refreshed, ...) by 06:00 UTC every
  day``: a constraint ("freshness deadline" = "06:00 UTC daily");
- what a thing stays on (``S stays on Airflow``), how far it is rolled out
  (``S is now on for 5% of users``), and a role as a value (``the incident
  commander is whoever holds the security on-call``).

A lead-in that names a thing ("Vendor offboarding, agreed with procurement:
...") is the subject of a time limit or a need whose sentence names none.

A value that is a list (``A, B and C``) gives one reading per value, in a
slot that holds many. A slot is (subject, attribute): ``the A of/for S`` and
``S's A`` split where the words say; a bare noun phrase is the subject, and
its attribute is `VALUE` ("the warehouse is Snowflake": warehouse, value).

Precision first, as in the closed rules: a value must be short and must name
something (`names_something`), never an opinion or a feeling; a subject is
never a pronoun or someone's ("my", "your"); a labelled line whose label is
a marker ("Update:", "Note:") or whose value is a clause says nothing here.
Pure functions of the text, the minute and its time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import NamedTuple

from contracts import Minute
from contracts.facts import FactType
from workers.rules.fact_text import (
    DETERMINERS,
    EVALUATIVE_WORDS,
    PRONOUNS,
    SCOPE_SUBJECT,
    STATE_WORDS,
    TRANSIENT_WORDS,
    Prepared,
    Reading,
    normalize_attribute,
    normalize_subject,
    parse_slot,
    prepare,
    sentences,
)
from workers.rules.relative_dates import NUMBER_WORDS, RELATIVE, day_of

VALUE = "value"  # the attribute of a slot named by a bare noun phrase
MEMBER = "member"  # the attribute of a list's values named by the list alone ("adding X to the device matrix")
OWNER = "owner"
MAX_ITEM_WORDS = 4  # a bare list item longer than this is a sentence
MAX_LABEL_WORDS = 8
MAX_OPEN_VALUE_WORDS = 6
MAX_OPEN_SUBJECT_WORDS = 6
MAX_LIST_VALUES = 8

# Verbs that say a slot's value changed, past or present ("bumped", "moves"), each with "to" before the new value.
CHANGE_VERBS = frozenset(
    {
        "bumped", "bump", "bumps", "raised", "raise", "raises", "lowered", "lower", "lowers", "increased",
        "increase", "increases", "decreased", "decrease", "decreases", "reduced", "reduce", "reduces", "moved",
        "move", "moves", "changed", "change", "changes", "switched", "switch", "switches", "set", "sets",
        "pinned", "pin", "pins", "upgraded", "upgrade", "upgrades", "downgraded", "downgrade", "downgrades",
        "tightened", "tighten", "tightens", "tightening", "relaxed", "relax", "relaxes", "loosened", "loosen",
        "extended", "extend", "extends", "shortened", "shorten", "shortens", "updated", "update", "updates",
        "migrated", "migrate", "migrates", "reverted", "revert", "reverts", "rolled back", "dropped", "drop",
        "drops", "cut", "cuts", "goes", "went", "go", "is going", "are going", "re-rated", "rerated", "back",
        "expanded", "narrowed", "capped", "limited", "bumping", "moving", "raising", "lowering", "pinning",
        "switching", "changing", "upgrading",
    }
)  # fmt: skip
_MOTION_VERBS = frozenset({"goes", "went", "go", "is going", "are going", "moves", "moved", "move", "moving"})
# Labels that mark what kind of line follows, not what it is about ("Update: ...", "FYI: ...").
MARKER_LABELS = frozenset(
    {
        "update", "updates", "status", "note", "notes", "fyi", "heads up", "heads-up", "question", "questions",
        "reminder", "edit", "ps", "p.s", "correction", "proposal", "plan", "todo", "to do", "next", "next up",
        "next steps", "blocker", "blockers", "result", "results", "summary", "context", "why", "reason", "problem",
        "issue", "ok", "done", "eta", "agenda", "action", "actions", "action items", "thoughts", "idea", "tldr",
        "tl;dr", "re", "subject", "update from", "progress", "outcome", "finding", "findings", "observation",
        "hint", "tip", "warning", "caution", "important", "example", "e.g", "i.e", "aside", "recap", "background",
        "answer", "reply", "follow-up", "follow up", "resolved", "fixed", "closed", "cause", "rationale", "also",
        "and", "but", "so", "then", "now", "today", "yesterday", "tomorrow", "later", "meanwhile", "lesson",
        "lessons", "takeaway", "risk", "risks", "scope", "method", "approach", "step", "steps", "rule",
    }
)  # fmt: skip
_FINITE = frozenset(
    {
        "is", "are", "was", "were", "will", "would", "should", "must", "might", "could", "can", "has", "have",
        "had", "do", "does", "did", "am", "be", "been", "being", "shall", "may", "need", "needs", "goes", "go",
        "went", "run", "runs", "get", "gets", "got", "take", "takes", "make", "makes", "say", "says", "said",
        "think", "thinks", "know", "knows", "want", "wants", "like", "likes", "love", "loves", "feel", "feels",
        "reads", "shows", "lists", "holds", "contains", "uses", "requires", "includes", "points", "means", "looks",
        "seems", "works", "stays", "remains", "becomes", "gives", "keeps", "lets", "puts", "beats", "waits",
        "broke", "grew", "fell", "rose", "began", "came", "found", "left", "lost", "hit", "sent", "built", "kept",
        "fixes", "stops", "breaks", "expires", "fails", "spikes", "causes", "returns", "blocks", "wins", "owns",
    }
)  # fmt: skip
_PREPOSITIONS = frozenset(
    {"on", "in", "at", "for", "to", "by", "with", "from", "of", "about", "into", "onto", "over", "under", "as"}
)
_OWN_WORDS = frozenset({"my", "your", "his", "her", "their", "mine", "yours", "i", "me", "you", "he", "she", "we"})
_LIST_MARK = re.compile(r"^\s*(?:[-*\u2022\u2713\u2714\u25aa\u25e6\u00b7>]|\d{1,2}[.)])\s+")
_LABELLED = re.compile(r"^(?P<label>[A-Za-z0-9][^:=]{0,80}?)\s*:\s+(?P<value>\S.*)$")
_PAREN = re.compile(r"\s*\([^()]*\)")
_VALUE_END = re.compile(
    r"\s*(?:;|\s[-\u2013\u2014]\s|\s+instead\s+of\b|\s+rather\s+than\b|,\s+(?:so|but|and\s+(?:it|this|that|we|the)|which|because|since|as|not|then|"
    r"until|unless|while|with|after|before|from|per|ok|okay|right)\b|\s+(?:because|since|until|unless|so\s+that|"
    r"which|while|after|before|except|now\s+that|once|from\s+now|from\s+today|from\s+tomorrow|starting|effective|for\s+now|"
    r"as\s+of|on\s+(?:main|both|all|every|the\s+\w+\s+branch)|across)\b).*$",
    re.I,
)
_TRAILING_TIME = re.compile(
    r"(?:,?\s+(?:today|tonight|now|again|too|as\s+well|for\s+now|going\s+forward|from\s+now\s+on|this\s+\w+|"
    r"next\s+\w+|yesterday|tomorrow|please|pls|thanks|thank\s+you))+$",
    re.I,
)
# "moved to iOS 17 for 8.0", "1.64 on the build image": the value is what comes before.
_FOR_WHAT = re.compile(r"\s+for\s+.+$|\s+(?:on|in|at|across)\s+(?:the|every|all|both|each|our|main)\b.*$", re.I)
_LIST_SPLIT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s*&\s*(?=[A-Z])")
_OF = re.compile(r"\s+(?:of|for|in|on)\s+", re.I)
_LABEL_OF = re.compile(r"\s+(?:of|for|in)\s+", re.I)  # "Tester on fix-login-bug:" is who speaks about what
# A name: capitalized words, an agent id ("release-captain") or a handle; case-sensitive inside patterns that are not.
_NAME = r"(?P<n>(?-i:(?:[A-Z][\w.'\-]*|[a-z][a-z0-9]*-[a-z0-9\-]+|@[\w\-]+)(?:\s+[A-Z][\w.'\-]*){0,3}))"
_OWNED_BY = re.compile(rf"^(?P<s>.+?)\s+(?:is|are|will\s+be|is\s+now|are\s+now)\s+owned\s+by\s+{_NAME}\b(?P<rest>.*)$")
_OWNS = re.compile(rf"^{_NAME}\s+(?:owns|now\s+owns|will\s+own|takes\s+over|took\s+over)\s+(?P<s>.+)$")
_HANDED = re.compile(
    rf"^(?:(?:i\s+am|i'm|we\s+are|we're)\s+)?(?:handing|handed|hand|passing|passed|giving|gave|transferring|"
    rf"transferred|reassigning|reassigned)\s+(?P<s>.+?)\s+(?:over\s+)?to\s+{_NAME}\b(?P<rest>.*)$",
    re.I,
)
_IS_HANDED = re.compile(
    rf"^(?P<s>.+?)\s+(?:is|are|has\s+been|have\s+been|was|were|gets|get)\s+(?:handed|passed|transferred|"
    rf"reassigned|moved)\s+(?:over\s+)?to\s+{_NAME}\b(?P<rest>.*)$",
    re.I,
)
_COPULA = re.compile(r"^(?P<np>.+?)\s+(?P<verb>is\s+now|are\s+now|will\s+be|is|are)\s+(?P<v>.+)$", re.I)
_CHANGE_LEAD = re.compile(
    r"^(?:(?:we|i)\s+(?:have\s+|just\s+|also\s+)?)?(?P<verb>[a-z\-]+)\s+(?P<np>.+?)\s+to\s+(?P<v>.+)$", re.I
)
_CHANGE_TAIL = re.compile(
    r"^(?P<np>.+?)\s+(?:(?:is|are|was|were|has\s+been|have\s+been|got|gets|now)\s+)?"
    r"(?P<verb>rolled\s+back|is\s+going|are\s+going|[a-z\-]+)\s+(?:back\s+)?to\s+(?P<v>.+)$",
    re.I,
)
_SWAPPING = re.compile(
    r"^(?:(?:we|i)\s+(?:are|am|have|will|were)?\s*)?(?:swapping|swapped|swap|replacing|replaced|replace)\s+"
    r"(?P<old>.+?)\s+(?:for|with|by)\s+(?P<v>.+)$",
    re.I,
)
_MOVED_OFF = re.compile(
    r"^(?:(?:we|i)\s+(?:are|am|have|were)?\s*)?(?:moved|moving|migrated|migrating|switched|switching)\s+"
    r"(?:off|away\s+from)\s+(?P<old>.+?)\s+(?:to|onto)\s+(?P<v>.+)$",
    re.I,
)
_REPLACES_OPEN = re.compile(r"^(?P<v>.+?)\s+(?:replaces|replaced|will\s+replace|is\s+replacing)\s+(?P<old>.+)$", re.I)
_ARROW = re.compile(
    r"^(?:(?:bumped|moved|changed|set|switched|upgraded|downgraded|raised|lowered)\s+)?(?P<np>.+?)\s*"
    r"(?:\u2192|->|=>)\s*(?P<v>.+)$",
    re.I,
)
_OLD_VALUE = re.compile(r"\s+(?:from\s+)?v?\d[\w.%]*$", re.I)
_BY_DAY = re.compile(
    r"^(?P<s>.+?)\s+(?:is|are|will|must|should|has|have|needs?|closes?|ends?|ships?|lands?|launch(?:es)?|"
    r"expires?|runs?|goes|opens?|starts?|completes?)\b.*?\s+(?P<by>by|before|on|no\s+later\s+than)\s+(?P<d>[^,;:]+)$",
    re.I,
)
_ASKED_BY = re.compile(
    r"^(?:.+?\s+)?(?:asks?|asked|needs?|needed|wants?|wanted|expects?|expected)\s+(?:for\s+)?"
    r"(?P<s>(?:the|our|their|a)\s+[^,;:]+?)\s+(?P<by>by|before|no\s+later\s+than)\s+(?P<d>[^,;:]+)$",
    re.I,
)
_CADENCES = (
    r"daily|weekly|monthly|quarterly|yearly|annually|nightly|hourly|biweekly|fortnightly|twice\s+a\s+\w+"
    r"|every\s+(?:other\s+|\w+\s+)?(?:day|week|month|quarter|year|hour|night|sprint|weekday|morning|evening)s?"
)
_CADENCE = re.compile(
    rf"^(?P<s>[^,;:]+?)\s+(?:now\s+)?(?:(?:is|are)\s+)?(?:now\s+)?(?P<verb>[a-z\-]+)\s+(?P<v>{_CADENCES})"
    r"(?:\s*[,;].*)?$",
    re.I,
)
_ADDED = re.compile(
    r"^(?:(?:i|we)(?:\s+am|\s+are|'m|'re|\s+have|'ve)?\s+(?:just\s+|also\s+)?)?(?:adding|added|add|adds)\s+"
    r"(?P<v>[^,;:]+?)\s+to\s+(?P<list>(?:the|our|this\s+\w+'s|[\w\-]+'s)\s+[^,;:]+?)(?:\s*[,;(].*)?$",
    re.I,
)
_ON_DAY = re.compile(rf"\s+(?:on|from)\s+(?P<d>{RELATIVE})$", re.I)  # after a changed value: when it holds from
_MINE = re.compile(
    r"^(?:(?:a\s+)?(?:reminder|note|fyi|heads[\s-]up)(?:\s+that)?[,:]?\s+)?(?P<s>.+?)\s+(?:is|are)\s+(?:now\s+)?mine\b"
    r"(?P<rest>.*)$",
    re.I,
)
# What someone says is theirs without owning a thing: "the mistake is mine", "the pleasure is all mine".
_NOT_OWNED = frozenset({"mistake", "fault", "error", "blame", "bad", "pleasure", "honor", "honour", "loss", "apology"})
_LEADING_THE = re.compile(r"^(?:the|a|an|our)\s+", re.I)
_LIST_OWNER = re.compile(r"^(?:the|our|this\s+\w+'s|[\w\-]+'s)\s+", re.I)
_LIVES = re.compile(
    r"^(?P<s>.+?)\s+(?:now\s+)?(?:lives?|is\s+kept|are\s+kept|is\s+stored|are\s+stored|is\s+hosted|are\s+hosted)"
    r"\s+(?:now\s+)?(?:in|at|on|under)\s+(?P<v>.+)$",
    re.I,
)
_CORRECTION = re.compile(r"\b(?:scratch\s+that|correction|corrected|actually|update)\b", re.I)
# A name written as an identifier ("TRANSFORM_WH", "minSdk", "dark_mode_v2"): a thing or a setting of its own, not a
# phrase of words; under a list's heading it is the subject, after a name it is the attribute.
_IDENTIFIER = re.compile(r"\b(?:[A-Za-z]+_[\w]+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z]{2,}_?[A-Z0-9_]*\d*)\b")
_RELATIVE = re.compile(r"\s+(?:that|which|who|we|i|you|they)\s+", re.I)  # "Columns in X that we treat as PII"
_LIST_ITEM_END = re.compile(r"\s+(?:for|on|in|with|at)\s+.+$", re.I)
_CLAUSES = re.compile(r",\s+(?:so|and|but|then)\s+|;\s+", re.I)
_METRIC = re.compile(r"\b(?:p\d\d|latency|rate|usage|cpu|memory|errors?|crash-free|anr|uptime|throughput|time)\b", re.I)
_SETTING_VERBS = frozenset(
    {"set", "bumped", "raised", "lowered", "re-rated", "rerated", "changed", "switched", "tightened", "relaxed"}
    | {"increased", "decreased", "reduced", "pinned", "upgraded", "downgraded", "back", "updated", "capped", "limited"}
)
_RATED = re.compile(
    r"^(?P<s>.+?)\s+(?:(?:is|are|was|were|has\s+been|got)\s+)?(?P<re>re-?)?rated\s+(?:as\s+|to\s+|at\s+)?(?P<v>.+?)"
    r"(?:\s+(?:because|since|as|after|due\s+to|given)\b.*)?$",
    re.I,
)
_WITHIN = re.compile(
    r"^(?P<s>.+?)\s+(?:is|are|will\s+be|must\s+be|should\s+be|shall\s+be|has\s+to\s+be|have\s+to\s+be|"
    r"needs?\s+to\s+be|gets?)\s+(?P<now>now\s+)?(?:always\s+)?(?P<p>[a-z]+(?:ed|en|id|ne))\s+within\s+"
    rf"(?P<v>(?:\d+(?:\.\d+)?|{'|'.join(NUMBER_WORDS)}|twelve|fifteen|twenty|thirty|sixty|ninety)\s+"
    r"(?:business\s+|working\s+|calendar\s+)?(?:minutes?|hours?|days?|weeks?|months?|years?))\b(?P<rest>.*)$",
    re.I,
)
_NEEDS = re.compile(
    r"^(?P<s>.+?)\s+(?P<now>now\s+)?(?:needs?|requires?|must\s+have)\s+(?P<least>at\s+least\s+)?"
    rf"(?P<n>\d+|{'|'.join(w for w in NUMBER_WORDS if w not in ('a', 'an'))})\s+"
    r"(?P<x>[a-z][\w\-]*(?:\s+[a-z][\w\-]*){0,2}?)(?P<rest>(?:\s+(?:from|by|of|in|on|for|before|per|each)\b.*|,.*)?)$",
    re.I,
)
_EACH = re.compile(r"^(?:every|each|all|any)\s+", re.I)
_PASSING_COUNTS = frozenset({"more", "extra", "another", "other", "few", "hours", "days", "minutes", "weeks"})
_NOT_BEFORE = re.compile(r",\s+not\s+\S", re.I)  # "within 4 hours of termination, not 24": the limit it replaces
# What is done, as the noun its deadline is named by; other participles by `_deadline` ("-ated": "-ation").
_DONE_NOUNS = {
    "revoked": "revocation", "removed": "removal", "deleted": "deletion", "paid": "payment", "answered": "response",
    "responded": "response", "acknowledged": "acknowledgement", "resolved": "resolution", "closed": "closure",
    "shipped": "delivery", "delivered": "delivery", "approved": "approval", "done": "completion",
    "completed": "completion", "given": "delivery", "sent": "delivery", "made": "completion", "signed": "signature",
    "disabled": "disabling", "enabled": "enabling", "processed": "processing", "purged": "purge", "wiped": "wipe",
}  # fmt: skip
# A time of day ("06:00", "9 am", "noon") with its zone, and how often it holds ("every day", "on Mondays").
TIME_OF_DAY = r"(?:\d{1,2}:\d{2}(?:\s*[ap]\.?m\.?)?|\d{1,2}\s*[ap]\.?m\.?|noon|midnight)(?:\s+(?:UTC|GMT|[A-Z]{2,4}T))?"
_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_READY_BY = re.compile(
    r"^(?:[^:]{1,80}:\s+)?(?P<s>[^,;:]+?)(?:\s*:\s+|\s+)(?:(?:is|are|must\s+be|should\s+be|shall\s+be|has\s+to\s+be|"
    r"have\s+to\s+be|needs?\s+to\s+be|will\s+be|gets?)\s+)?(?P<now>now\s+)?(?:always\s+)?"
    r"(?P<a>fresh|ready|available|loaded|refreshed|up[\s-]to[\s-]date|complete|completed|done|finished|delivered|"
    r"published|built)\s+(?:by|before|no\s+later\s+than)\s+"
    rf"(?P<t>{TIME_OF_DAY})(?P<when>\s+(?:every\s+day|each\s+day|daily|every\s+weekday|on\s+weekdays|weekdays|"
    rf"(?:every|each|on)\s+{_WEEKDAY}s?))?\b(?P<rest>.*)$",
    re.I,
)
# What a thing is by a time, as the noun its deadline is named by ("fresh by 06:00": the freshness deadline).
_READY_NOUNS = {
    "fresh": "freshness", "up to date": "freshness", "up-to-date": "freshness", "ready": "readiness",
    "available": "availability", "loaded": "load", "refreshed": "refresh", "complete": "completion",
    "completed": "completion", "done": "completion", "finished": "completion", "delivered": "delivery",
    "published": "publication", "built": "build",
}  # fmt: skip
_STAYS_ON = re.compile(
    r"^(?P<s>[^,;:]+?)\s+(?:stays?|remains?|will\s+stay|will\s+remain|keeps?\s+running|continues?\s+to\s+run)\s+"
    r"(?:on|in)\s+(?P<v>.+)$",
    re.I,
)
_ROLLED_OUT = re.compile(
    r"^(?P<s>[^,;:]+?)\s+(?:(?:is|are)\s+)?(?P<now>now\s+)?(?:on|enabled|live|rolled\s+out|ramped(?:\s+up)?)\s+"
    r"(?:for|to|at)\s+(?P<v>\d+(?:\.\d+)?\s*%)(?:\s+of\s+(?:the\s+)?(?:users|sessions|traffic|devices|installs|"
    r"requests|customers|accounts|tenants))?(?:\s*[,;(.].*)?$",
    re.I,
)
# "The incident commander is whoever holds the security on-call": the role that is the value.
_WHEN_HELD = re.compile(
    r"\s+(?:at\s+the\s+time|that\s+(?:day|week|month|night|sprint|cycle)|this\s+\w+|each\s+\w+)$", re.I
)
_WHOEVER = re.compile(r"^(?:whoever|whichever\s+\w+)\s+(?:holds|has|is\s+on|owns|runs|is)\s+(?P<v>.+)$", re.I)
_KEPT = re.compile(r"^(?P<s>.+?)\s+(?:is|are)\s+(?:now\s+)?(?:kept|retained|stored|held)\s+for\s+(?P<v>.+)$", re.I)
_PASSIVE = re.compile(
    r"^(?P<s>.+?)\s+(?:is|are|will\s+be)\s+(?P<now>now\s+)?(?P<p>[a-z]+ed|built|run|held|kept|made|done)\s+"
    r"(?P<prep>by|with|from|through|via|in|at)\s+(?P<v>.+)$",
    re.I,
)
# Participles that say how a thing is doing, or how someone feels, not how it is done.
_PASSING_PARTICIPLES = frozenset(
    {
        "blocked", "delayed", "stuck", "broken", "affected", "caused", "fixed", "reverted", "rejected", "failed",
        "killed", "paused", "stopped", "interrupted", "impacted", "surprised", "excited", "interested", "inspired",
        "amazed", "tired", "worried", "pleased", "thrilled", "disappointed", "confused", "scheduled", "planned",
        "expected", "supposed", "required", "needed", "asked", "told", "reviewed", "tested", "checked", "done",
    }
)  # fmt: skip
_BOUND = re.compile(
    r"^(?:at\s+least|at\s+most|no\s+more\s+than|no\s+less\s+than|up\s+to|under|over|below|above)\s+\S", re.I
)
_FROM = re.compile(r"\s+from\s+.+$", re.I)
_LEADING_MODIFIERS = re.compile(r"^(?:new|current|old|latest|final|official|chosen|agreed)\s+", re.I)


class _Said(NamedTuple):
    """The minute a sentence is from and the vocabulary its slots are named with."""

    minute: Minute
    vocabulary: Mapping[str, str] | None
    at: datetime
    topic: str | None = None  # what a lead-in names ("Vendor offboarding, agreed: ..."), for a sentence with no subject

    @property
    def agent_id(self) -> str:
        return (self.minute.agent_id or "").lower()


class Line(NamedTuple):
    """A sentence of a note and the subject of the list it is an item of (None outside a list)."""

    text: str
    heading: str | None
    introduced: bool = False  # the heading ends with a colon: its items are what it names ("Devices:", "- Pixel 8")


def lines(text: str) -> Iterator[Line]:
    """The sentences of a note, each with its list's heading subject when it is an item of a list.

    A list is a run of lines that start with a bullet or a number; its
    heading is the line before the run (its last sentence, up to the first
    comma, colon or parenthesis).
    """
    heading: str | None = None
    previous = ""
    for raw in text.split("\n"):
        if not raw.strip():
            continue
        if _LIST_MARK.match(raw):
            if heading is None:
                heading = heading_subject(previous) or ""
            introduced = bool(heading) and previous.rstrip().endswith(":")
            for sentence in sentences(_LIST_MARK.sub("", raw, count=1)):
                yield Line(sentence, heading or None, introduced)
        else:
            heading = None
            previous = raw
            for sentence in sentences(raw):
                yield Line(sentence, None)


# A sentence whose subject is "it" or "they" (that, this and these point at events as often as at things).
_PRONOUN_SUBJECT = re.compile(r"^(?:it|they)(?=\s+(?:is|are|was|were|has|have|had|will|now|runs|uses|lives)\b)", re.I)


def with_antecedent(sentence: str, before: str) -> str:
    """`sentence` with a subject "it" or "they" replaced by `before`, the subject the sentence before was read
    about ("It now lives in the tools repo" after "The export service is owned by Ana"); else as it is."""
    pronoun = _PRONOUN_SUBJECT.match(sentence)
    if pronoun is None or not before or before == SCOPE_SUBJECT:
        return sentence
    return before + sentence[pronoun.end() :]


def heading_subject(line: str) -> str | None:
    """What a list's heading line names: its last sentence up to the first comma, colon or parenthesis."""
    parts = list(sentences(line))
    if not parts:
        return None
    head = re.split(r"[,:(]|\s+as\s+|\s+agreed\b|\s+so\s+", parts[-1], maxsplit=1)[0].strip(" .")
    subject = normalize_subject(head)
    words = subject.split()
    if not words or len(words) > MAX_OPEN_SUBJECT_WORDS or words[0] in PRONOUNS:
        return None
    return subject


def read_open(
    line: Line,
    minute: Minute,
    at: datetime,
    vocabulary: Mapping[str, str] | None = None,
    *,
    prepared: Prepared | None = None,
) -> list[Reading]:
    """What one sentence states about an open slot, one reading per value; [] when it states nothing readable.

    `vocabulary` (`fact_text.vocabulary`, `ATTRIBUTES` when None): a slot phrase the closed rules would name is
    named as they name it ("Image service replica count updated to 3": image service, replicas)."""
    prepared = prepared or prepare(line.text, minute, at)
    if prepared is None or prepared.goal_label:
        return []
    supersedes, valid_from = prepared.supersedes, prepared.valid_from
    prepared = prepared._replace(text=prepared.text.rstrip(" ;,:"))  # "…by 30 June 2026; that is the end date"
    lead = _LABELLED.match(prepared.text)
    if lead and not _label_ok(_label_of(lead.group("label")), line.heading, _Said(minute, vocabulary, at)):
        # "Scratch that: the warehouse is Snowflake", "Agreed with finance: from the 1st the SLA relaxes to 07:00":
        # a lead-in, then the statement.
        rest = prepare(lead.group("value"), minute, at)
        if rest is None or rest.goal_label:
            return []
        found = _shapes(rest.text, line.heading, _Said(minute, vocabulary, at))
        topic = _topic(lead.group("label"), _Said(minute, vocabulary, at))
        if not found and topic:  # "Vendor offboarding, agreed: when a contract ends, each key is revoked within 5 days"
            found = _shapes(rest.text, line.heading, _Said(minute, vocabulary, at, topic))
        if not found:  # "The review cycle closes on 30 June: every team signs off by then"
            found = _one_shape(lead.group("label"), None, _Said(minute, vocabulary, at))
        supersedes = supersedes or rest.supersedes or _CORRECTION.search(lead.group("label")) is not None
        valid_from = rest.valid_from or valid_from
    else:
        said = _Said(minute, vocabulary, at)
        found = _shapes(prepared.text, line.heading, said)
        if not found and lead:
            found = _under_label(lead.group("label"), lead.group("value"), said)
        if not found and line.introduced and line.heading:
            found = _item(prepared.text, line.heading, said)
    return [
        _dated(r, at)._replace(
            supersedes=r.supersedes or supersedes,
            valid_from=r.valid_from or valid_from,
            decision_label=prepared.decision_label,
        )
        for r in found
    ]


_DATE_ATTRIBUTES = frozenset({VALUE, "date", "target date", "due date", "end date", "due", "deadline", "cutoff date"})


def _topic(label: str, minute: _Said) -> str | None:
    """The thing a lead-in names before its first comma ("Vendor offboarding, agreed with procurement"), or None
    when it names none ("Agreed with HR", "Per the policy")."""
    words = label.split(",")[0].lower().split()
    if not words or _participle(words[0]) or any(w in _PREPOSITIONS or w in _LEAD_MARKERS for w in words):
        return None
    return _subject(" ".join(words), minute)


def _dated(reading: Reading, at: datetime) -> Reading:
    """A value that names a day as its ISO date ("15 June" -> 2026-06-15); a date attribute's slot is the deadline."""
    day = day_of(reading.value, at)
    if day is None:
        return reading
    attribute = "deadline" if reading.attribute in _DATE_ATTRIBUTES else reading.attribute
    return reading._replace(value=day.isoformat(), attribute=attribute)


def _shapes(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    found = _one_shape(s, heading, minute)
    if found:
        return found
    # "I'm moving to the growth squad, so the customers domain is handed over to Ines": each clause alone.
    for clause in _CLAUSES.split(s)[1:]:
        found = _one_shape(clause, heading, minute)
        if found:
            return found
    return []


def _one_shape(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    low = f" {s.lower()} "
    for rule, needs in _SHAPES:
        if needs is not None and not needs.search(low):
            continue  # the words the shape turns on are not there: its pattern cannot match
        found = rule(s, heading, minute)
        if found:
            return found
    return []


def _under_label(label: str, value: str, minute: _Said) -> list[Reading]:
    """A label whose value is itself a statement: "wear os companion app: minSdk goes to 30" (the label is the
    subject of what the statement names), "Data owners: Raj owns customers, Ines owns finance"; else what the words
    before the colon state ("The review cycle closes on 30 June: all reviews signed off by then")."""
    found = _one_shape(value, None, minute)
    subject = _subject(label, minute)
    if found and subject:
        return [_relabelled(r, subject, minute) for r in found]
    if found:
        return found
    return _one_shape(label, None, minute)


def _relabelled(reading: Reading, subject: str, minute: _Said) -> Reading:
    """A reading of a label's value about the label's subject: "Checkout page: request timeout is 30 seconds" is
    the checkout page's request_timeout, "wear os app: minSdk goes to 30" its minsdk."""
    named = normalize_attribute(f"{reading.subject} {reading.attribute}", minute.vocabulary)
    if named:
        return reading._replace(subject=subject, attribute=named)
    if reading.attribute == VALUE:
        return reading._replace(subject=subject, attribute=reading.subject)
    return reading


def _item(s: str, heading: str, minute: _Said) -> list[Reading]:
    """A bare item of a list its heading introduces ("Device matrix:" then "• Pixel 8 (Android 14)"): a value of the
    heading's slot, one of many."""
    values = _values(s, plural=False)
    if len(values) != 1 or len(values[0].split()) > MAX_ITEM_WORDS or not names_something(values[0]):
        return []
    rest = [w for w in values[0].split()[1:] if w.islower()]
    if any(w in DETERMINERS or w.endswith(("s", "ed")) for w in rest):
        return []  # "4.2 opens the cycle", "212 dbt assets loaded": a sentence, not a name
    slot = _slot(heading, None, minute)
    if slot is None:
        return []
    return [Reading(FactType.FACT, *slot, values[0], "open_item", single_valued=False)]


# -- the shapes ----------------------------------------------------------------------------------------


def _ownership(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    # "Raj owns customers, Ines owns finance": each clause alone.
    clauses = [c.strip() for c in re.split(r",\s*(?:and\s+)?|\s+and\s+|;\s*", s)]
    owning = [(m, _subject(m.group("s"), minute)) for m in map(_OWNS.match, clauses) if m]
    if len(clauses) > 1 and len(owning) > 1:
        return [
            Reading(FactType.ENTITY, subject, OWNER, m.group("n").strip(), "open_owner", single_valued=True)
            for m, subject in owning
            if subject
        ]
    mine = _MINE.match(s)
    if mine is not None:
        # "Reminder that store submissions are mine this cycle": the speaker owns it.
        subject = _subject(_PAREN.sub("", mine.group("s")), minute)
        speaker = minute.agent_id
        rest = re.split(r"[,;]", mine.group("rest"), maxsplit=1)[0]
        if subject is not None and speaker and not _is_clause(rest) and subject.split()[-1] not in _NOT_OWNED:
            return [Reading(FactType.ENTITY, subject, OWNER, speaker, "open_owner", True, single_valued=True)]
    for pattern, supersedes in ((_OWNED_BY, False), (_OWNS, False), (_HANDED, True), (_IS_HANDED, True)):
        match = pattern.match(s)
        if match is None:
            continue
        subject = _subject(_PAREN.sub("", match.group("s")), minute)
        owner = match.group("n").strip()
        rest = re.split(r"[,;]", match.groupdict().get("rest") or "", maxsplit=1)[0]
        if subject is None or not owner or owner.lower() in PRONOUNS or _is_clause(rest):
            continue
        return [Reading(FactType.ENTITY, subject, OWNER, owner, "open_owner", supersedes, single_valued=True)]
    return []


def _labelled(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    match = _LABELLED.match(s)
    if match is None:
        return []
    label = _label_of(match.group("label"))
    if not _label_ok(label, heading, minute) or _ARROW.match(match.group("value")):
        return []  # "Label: old → new" is a change (`_arrow`)
    slot = _slot(label, heading, minute)
    if slot is None:
        return []
    words = label.lower().split()
    pairs = _pairs(match.group("value"))
    if len(pairs) > 1 or (pairs and _IDENTIFIER.fullmatch(pairs[0][0])):
        # "Android: minSdk 24, targetSdk 34": the label is the subject, each name an attribute
        subject = _subject(label, minute) if heading else slot[0]
        if subject:
            return [Reading(FactType.FACT, subject, name.lower(), value, "open_label") for name, value in pairs]
    plural = _plural(words[-1]) or _plural(_of_head(label))
    values = _values(match.group("value"), plural=plural)
    if plural and len(values) > 1:
        values = [_LIST_ITEM_END.sub("", v) for v in values]  # "Looker for governed dashboards": Looker
    named = [names_something(v) for v in values]
    if not values or not (all(named) or (len(values) > 2 and sum(named) * 2 > len(values))):
        return []  # "Runbook for the store: check for a leak first": an instruction, not a value
    subject, attribute = slot
    many = len(values) > 1
    return [Reading(FactType.FACT, subject, attribute, v, "open_label", single_valued=not many) for v in values]


def _label_of(said: str) -> str:
    """A line's label without its aside or its relative clause: "BI tools we support (2026)" -> "BI tools"."""
    return _RELATIVE.split(_PAREN.sub("", said).strip(), maxsplit=1)[0]


def _label_ok(label: str, heading: str | None, minute: _Said) -> bool:
    """Whether a line's label names what its value is: a short noun phrase, not a marker, a speaker or a clause."""
    words = label.lower().split()
    if not words or len(words) > MAX_LABEL_WORDS or label.lower() in MARKER_LABELS or words[0] in _LEAD_MARKERS:
        return False
    if label.lower() == minute.agent_id or words[0] in _QUANTIFIERS or words[0] in ("a", "an"):
        return False
    if any(w in _FINITE or (w in PRONOUNS and w not in _DEMONSTRATIVES) or w in TRANSIENT_WORDS for w in words):
        return False
    if _participle(words[0]) and len(words) > 1 and words[1] in DETERMINERS:
        return False  # "checked the config: ...": what someone did
    if any(_participle(w) for w in words[1:]) or (len(words) > 2 and words[0].endswith("ing")):
        return False  # "CI images updated: ...", "Making the fix standard: ...": a clause, not a name
    head = _LABEL_OF.split(label.lower(), maxsplit=1)[0].split()
    if any(w in _PREPOSITIONS for w in head):
        return False  # "handoff to Ines for ...", "agreed with finance"
    # "Priya: ...": who speaks, not what is said
    return not (
        len(words) == 1 and label[:1].isupper() and heading is None and label.lower() not in _COMMON_LABEL_WORDS
    )


def _pairs(text: str) -> list[tuple[str, str]]:
    """``name value, name value``: [(name, value), ...] when every part of a list is an identifier and a value."""
    parts = [p.strip(" .") for p in re.split(r"\s*[,;]\s*", _PAREN.sub("", text)) if p.strip(" .")]
    out = []
    for part in parts:
        match = re.fullmatch(r"(?P<name>[A-Za-z][\w\-]*[a-z][A-Z][\w\-]*|[a-z]+_[a-z_]+)\s+(?P<value>\S+)", part)
        if match is None:
            return []
        out.append((match.group("name"), match.group("value")))
    return out


def _change(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    for pattern in (_CHANGE_LEAD, _CHANGE_TAIL):
        match = pattern.match(s)
        if match is None:
            continue
        verb = " ".join(match.group("verb").lower().split())
        if verb not in CHANGE_VERBS:
            continue
        if pattern is _CHANGE_TAIL and not _inflected(verb):
            continue  # "reviewed a small change to X": a noun, not the verb
        phrase = _FROM.sub("", match.group("np"))
        if phrase.lower().split()[0] in PRONOUNS:
            continue
        if verb == "back" and _METRIC.search(phrase):
            continue  # "cold start p50 back to 1.12 s": a measurement, not a setting
        slot = _slot(phrase, None, minute)  # a change in a list is about what it names, not the heading
        said, on_day = _FOR_WHAT.sub("", match.group("v").split(", ")[0]), None
        when = _ON_DAY.search(said)
        if when is not None and (on_day := day_of(when.group("d"), minute.at)) is not None:
            said = said[: when.start()]  # "goes to 14 characters on 1 July": the value from that day
        values = _values(said, plural=False)
        if slot is None or len(values) != 1:
            continue
        short = verb in _SETTING_VERBS and len(values[0].split()) <= 3 and values[0].split()[0].lower() not in PRONOUNS
        if not (names_something(values[0]) or short):
            continue
        if verb in _MOTION_VERBS and not any(ch.isdigit() for ch in values[0]):
            continue  # "a second breach goes to Lena": who handles it, not a value; "goes to 25%" is one
        return [Reading(FactType.FACT, *slot, values[0], "open_change", supersedes=True, valid_from=on_day)]
    return []


def _copula(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    match = _COPULA.match(s)
    if match is None:
        return []
    phrase, value = match.group("np"), match.group("v")
    first = value.split()[0].lower()
    if first in ("not", "no", "never", "also", "still", "just", "only", "probably", "maybe", "likely"):
        return []
    supersedes = match.group("verb").lower().endswith("now")
    inverted = re.match(r"^(?:the|our)\s+(?P<a>.+?)\s+(?:of|for)\s+(?P<s>.+)$", value, re.I)
    if inverted and _names_all(phrase):
        # "Security and Availability are the trust service criteria for this audit"
        subject = _subject(inverted.group("s"), minute)
        attribute = _attribute(inverted.group("a"), minute)
        values = _values(phrase, plural=True)
        if subject and attribute and values:
            many = len(values) > 1
            return [
                Reading(FactType.FACT, subject, attribute, v, "open_copula", single_valued=not many) for v in values
            ]
        return []
    if first == "due":  # "S is due next Monday": the closed rules' deadline, however the sentence ends
        day = day_of(_values(value[4:], plural=False)[0], minute.at) if _values(value[4:], plural=False) else None
        subject = _subject(phrase, minute)
        return [Reading(FactType.FACT, subject, "deadline", day.isoformat(), "deadline")] if day and subject else []
    whoever = _WHOEVER.match(value)
    if whoever is not None:  # "the incident commander is whoever holds the security on-call at the time"
        slot = _slot(phrase, None, minute)
        role = _LEADING_THE.sub("", _FOR_WHAT.sub("", _VALUE_END.sub("", whoever.group("v"))))
        role = _WHEN_HELD.sub("", role).strip(" ,.;:")
        if slot is None or not role or len(role.split()) > MAX_ITEM_WORDS or _is_clause(role):
            return []
        return [Reading(FactType.FACT, *slot, role, "open_copula", supersedes=supersedes)]
    bounded = _BOUND.match(value) is not None and any(ch.isdigit() for ch in value)  # "at least 12 characters"
    if not bounded and (first in _PREPOSITIONS or first in DETERMINERS or first in STATE_WORDS or _participle(first)):
        return []
    slot = _slot(phrase, None, minute)
    values = _values(value.split(", ")[0], plural=False)  # "Tuesday 12:00 UTC, so QA gets a day": the value
    if slot is None or len(values) != 1 or not names_something(values[0]):
        return []
    return [Reading(FactType.FACT, *slot, values[0], "open_copula", supersedes=supersedes)]


def _rated(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Zendesk is rated high risk", "the vendor was re-rated to medium": the rating a thing holds."""
    match = _RATED.match(s)
    if match is None:
        return []
    subject = _head_subject(match.group("s"), minute)
    value = _VALUE_END.sub("", match.group("v").split(", ")[0]).strip(" ,.;:")  # "high risk": a state word is a rating
    if subject is None or not value or len(value.split()) > 3 or _is_clause(value):
        return []
    return [Reading(FactType.FACT, subject, "rating", value, "open_copula", supersedes=match.group("re") is not None)]


def _kept_for(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Raw event data is kept for 400 days": how long a thing is kept."""
    match = _KEPT.match(s)
    if match is None:
        return []
    subject = _head_subject(match.group("s"), minute)
    values = _values(match.group("v").split(", ")[0], plural=False)
    if subject is None or len(values) != 1 or not any(ch.isdigit() for ch in values[0]):
        return []
    return [Reading(FactType.FACT, subject, "retention", values[0], "open_copula")]


def _within(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "A leaver's access is revoked within 24 hours of termination", "affected customers are notified within 72
    hours": the time limit on what is done to a thing, a constraint ("revocation deadline"). "..., not 24" after it,
    or "now", says it replaces the limit held."""
    match = _WITHIN.match(s)
    if match is None:
        return []
    subject = _head_subject(_EACH.sub("", match.group("s")), minute) or minute.topic  # "every key": each one
    if subject is None:
        return []
    changed = match.group("now") is not None or _NOT_BEFORE.search(match.group("rest")) is not None
    attribute = f"{_deadline(match.group('p').lower())} deadline"
    value = f"within {' '.join(match.group('v').split()).lower()}"
    return [
        Reading(FactType.CONSTRAINT, subject, attribute, value, "open_within", supersedes=changed, single_valued=True)
    ]


def _ready_by(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "The finance mart is fresh by 06:00 UTC every day", "Nightly export: ready by 7 am on weekdays": the time of
    day a thing must be in a state by, a constraint ("freshness deadline" = "06:00 UTC daily"); "now", or ", not M"
    after it, says it replaces the time held."""
    match = _READY_BY.match(s)
    if match is None:
        return []
    subject = _head_subject(match.group("s"), minute)
    if subject is None:
        return []
    state = " ".join(match.group("a").lower().replace("-", " ").split())
    attribute = f"{_READY_NOUNS.get(state, state)} deadline"
    value = " ".join(match.group("t").split())
    when = " ".join((match.group("when") or "").lower().split())
    if when in ("every day", "each day", "daily"):
        value += " daily"
    elif when:
        day = when.split()[-1].rstrip("s")  # "on mondays", "every monday": Mondays
        value += f" {day.capitalize()}s" if day != "weekday" else " weekdays"
    changed = match.group("now") is not None or _NOT_BEFORE.search(match.group("rest")) is not None
    return [
        Reading(FactType.CONSTRAINT, subject, attribute, value, "open_ready_by", supersedes=changed, single_valued=True)
    ]


def _stays_on(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Marketing's legacy DAGs stay on Airflow until they're rewritten": what a thing runs on, said as kept."""
    match = _STAYS_ON.match(s)
    if match is None:
        return []
    subject = _head_subject(match.group("s"), minute)
    values = _values(match.group("v"), plural=False)
    if subject is None or len(values) != 1 or not names_something(values[0]) or values[0][0].isdigit():
        return []  # "core stays on 1.8": the version of what was just said, not what it runs on
    return [Reading(FactType.FACT, subject, "platform", values[0], "open_stays", single_valued=True)]


def _rolled_out(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "The offline_sync flag is now on for 5% of users": how far a thing is rolled out, the value a later "goes to
    25%" changes."""
    match = _ROLLED_OUT.match(s)
    if match is None:
        return []
    subject = _head_subject(match.group("s"), minute)
    if subject is None:
        return []
    value = match.group("v").replace(" ", "")
    return [Reading(FactType.FACT, subject, VALUE, value, "open_change", supersedes=match.group("now") is not None)]


def _needs(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Every production change needs one approving review": how many of a thing each one requires, a constraint
    ("required approving review" -> "1 approving review"); "..., not one" after it, or "now", says it replaces the
    number held. A passing need ("the migration needs 3 more days") is none."""
    match = _NEEDS.match(s)
    if match is None:
        return []
    things = match.group("x").lower().split()
    if things[0] in _PASSING_COUNTS or things[-1] in _PASSING_COUNTS:
        return []
    subject = _head_subject(_EACH.sub("", match.group("s")), minute) or minute.topic  # "every change": each one
    if subject is None:
        return []
    count = match.group("n").lower()
    number = str(NUMBER_WORDS[count]) if count in NUMBER_WORDS else count
    head = things[-1][:-1] if things[-1].endswith("s") and not things[-1].endswith("ss") else things[-1]
    attribute = "required " + " ".join([*things[:-1], head])
    value = f"{'at least ' if match.group('least') else ''}{number} {' '.join(match.group('x').split())}"
    changed = match.group("now") is not None or _NOT_BEFORE.search(match.group("rest")) is not None
    return [
        Reading(FactType.CONSTRAINT, subject, attribute, value, "open_needs", supersedes=changed, single_valued=True)
    ]


def _deadline(done: str) -> str:
    """What a deadline is named by, from the participle of what is done: "revoked" -> "revocation", "notified" ->
    "notification", "rotated" -> "rotation", "reviewed" -> "review"."""
    if done in _DONE_NOUNS:
        return _DONE_NOUNS[done]
    if done.endswith("ified"):
        return done[:-3] + "ication"
    if done.endswith("ated"):
        return done[:-2] + "ion"
    if done.endswith("ed") and len(done) > 4:
        stem = done[:-2]  # "patched" -> "patch", "planned" -> "plan", "installed" -> "install"
        return stem[:-1] if len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] in "bdgmnprt" else stem
    return done


def _passive(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Remote feature flags are served from Firebase Remote Config", "the pen test is booked with Halberd Security":
    how a thing is done, and by what or whom."""
    match = _PASSIVE.match(s)
    if match is None or match.group("p").lower() in _PASSING_PARTICIPLES:
        return []
    subject = _head_subject(match.group("s"), minute)
    values = _values(match.group("v").split(", ")[0], plural=False)
    if subject is None or len(values) != 1 or not names_something(values[0]):
        return []
    attribute = f"{match.group('p').lower()} {match.group('prep').lower()}"
    return [
        Reading(FactType.FACT, subject, attribute, values[0], "open_copula", supersedes=match.group("now") is not None)
    ]


def _swap(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "We're swapping Firebase Remote Config for ConfigCat", "Dagster replaces Airflow": a new value named with the
    old one only. The slot is the old value's (`workers.facts.extraction.resolve_open_slots` finds it, or drops
    the statement); until then the reading stands in the old value's own name."""
    match = _SWAPPING.match(s) or _MOVED_OFF.match(s) or _REPLACES_OPEN.match(s)
    if match is None:
        return []
    said = match.group("v").split(", ")[0]
    named = re.match(r"^(?P<v>.+?)\s+as\s+(?P<slot>.+)$", said, re.I)  # "... for DynamoDB as the gateway's DB"
    slot = _slot(named.group("slot"), None, minute) if named else None
    old = _values(match.group("old").split(", ")[0], plural=False)
    new = _values(named.group("v") if named and slot else said, plural=False)
    if len(old) != 1 or len(new) != 1 or not names_something(old[0]) or not names_something(new[0]):
        return []
    if slot is not None:  # the sentence names the slot itself
        return [Reading(FactType.FACT, *slot, new[0], "open_swap", supersedes=True)]
    subject = normalize_subject(old[0])
    if not subject:
        return []
    return [Reading(FactType.FACT, subject, VALUE, new[0], "open_swap", supersedes=True, replaces=old[0])]


def _arrow(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "bumped dbt-core 1.7 → 1.8", "checkout_v3 → 50%", "Deployment target: iOS 15 -> iOS 16": a change."""
    match = _ARROW.match(s)
    if match is None:
        return []
    phrase = match.group("np")
    # "Deployment target: iOS 15 -> iOS 16": the label names it; "dbt-core 1.7 → 1.8": the old value after the name
    phrase = phrase.split(":", 1)[0] if ":" in phrase else _OLD_VALUE.sub("", phrase)
    slot = _slot(phrase, None, minute)
    values = _values(_FOR_WHAT.sub("", match.group("v")), plural=False)
    if slot is None or len(values) != 1 or not names_something(values[0]):
        return []
    return [Reading(FactType.FACT, *slot, values[0], "open_change", supersedes=True)]


def _dated_by(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Redshift is decommissioned by 30 June 2026", "the review cycle closes on 30 June", "the auditors ask for
    the evidence package by 15 June": the day it is due."""
    match = _BY_DAY.match(s) or _ASKED_BY.match(s)  # "Prescott & Lang ask for the Q2 evidence package by 15 June"
    if match is None:
        return []
    values = _values(match.group("d"), plural=False)
    day = day_of(values[0], minute.at) if len(values) == 1 else None
    subject = _head_subject(match.group("s"), minute)
    if day is None or subject is None:
        return []
    due = re.search(r"\bdue\b", s, re.I) is not None  # "is due by": the closed rules' deadline, a fact
    reading = Reading(
        FactType.FACT if due else FactType.GOAL, subject, "deadline", day.isoformat(), "open_due", single_valued=True
    )
    if match.group("by").lower() == "on":  # "closes on 30 June": the day it is due, said as a fact
        return [reading._replace(type=FactType.FACT)]
    return [reading]


def _head_subject(phrase: str, minute: _Said) -> str | None:
    """The subject a phrase names, or the head before its qualifier ("user access reviews for all in-scope
    systems": the user access reviews) when the whole is too long to be one."""
    subject = _subject(phrase, minute)
    words = normalize_subject(_PAREN.sub("", phrase)).split()
    if (
        subject is None
        and len(words) > MAX_OPEN_SUBJECT_WORDS
        and not any(w in _FINITE or w in PRONOUNS for w in words)
    ):
        head = _OF.split(_PAREN.sub("", phrase), maxsplit=1)[0]
        subject = _subject(head, minute) if head != phrase else None
    return subject


def _cadence(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "User access reviews run quarterly", "Production access is reviewed monthly": how often ("now runs
    weekly": a change)."""
    match = _CADENCE.match(s)
    if match is None or not _verb_form(match.group("verb").lower()):
        return []
    subject = _head_subject(match.group("s"), minute)
    if subject is None:
        return []
    value = match.group("v").lower()
    changed = "now" in s[match.end("s") : match.start("verb")].lower().split()
    return [Reading(FactType.FACT, subject, "cadence", value, "open_cadence", supersedes=changed)]


def _added(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Adding Twilio to this year's review list", "I'm adding the iPhone SE (3rd gen) to the device matrix": one
    more value of a list (`MEMBER`, many values). The list is named as the sentence names it; the facts pool
    finds the held list it names (`workers.facts.extraction.resolve_open_slots`)."""
    match = _ADDED.match(s)
    if match is None:
        return []
    value = _LEADING_THE.sub("", match.group("v")).strip(" ,.;:")
    subject = _subject(_LIST_OWNER.sub("", match.group("list")), minute)
    if subject is None or not value or _is_clause(value) or not names_something(value) or value[0].isdigit():
        return []  # "we added 2 GB to the cache": an amount, not a member
    return [Reading(FactType.FACT, subject, MEMBER, value, "open_added", single_valued=False)]


def _located(s: str, heading: str | None, minute: _Said) -> list[Reading]:
    """ "Policies now live in the grc-policies git repo": where a thing is kept."""
    match = _LIVES.match(s)
    if match is None:
        return []
    subject = _head_subject(match.group("s"), minute)
    values = _values(match.group("v"), plural=False)
    if subject is None or len(values) != 1 or values[0].split()[0].lower() in EVALUATIVE_WORDS:
        return []
    return [Reading(FactType.FACT, subject, "location", values[0], "open_location", supersedes=True)]


# -- the parts -----------------------------------------------------------------------------------------

_DEMONSTRATIVES = frozenset({"this", "these", "those"})
_LEAD_MARKERS = frozenset({"update", "note", "fyi", "question", "reminder", "re", "ps", "edit", "correction"})
_QUANTIFIERS = frozenset(
    {
        "everything", "anything", "nothing", "something", "everyone", "anyone", "all", "each", "every", "any",
        "some", "both", "none", "most", "other", "others", "rest", "no", "more", "less", "fewer",
    }
)  # fmt: skip
_VALUE_FIRST_REJECTS = frozenset(
    {"exactly", "as", "like", "about", "around", "roughly", "almost", "basically", "pretty", "quite", "very", "so"}
    | {"too"}
)
# Words in -ing that name a thing, not an activity ("crash reporting", "billing").
_ING_NOUNS = frozenset(
    {"billing", "logging", "hosting", "pricing", "routing", "caching", "monitoring", "reporting", "tracking", "crash"}
    | {"onboarding", "offboarding", "deprovisioning", "provisioning", "staging", "marketing", "testing", "building"}
)
_COMMON_LABEL_WORDS = frozenset({"auditor", "owner", "report", "region", "vendor", "tool", "platform", "deadline"})


def names_something(value: str) -> bool:
    """Whether a value names a thing: a capitalized word past its first, a number, an identifier or a quote."""
    words = value.split()
    if not words or len(words) > MAX_OPEN_VALUE_WORDS:
        return False
    lowered = [w.lower().strip(",.") for w in words]
    first = lowered[0]
    if first in EVALUATIVE_WORDS or first in PRONOUNS or first in _OWN_WORDS or first in _VALUE_FIRST_REJECTS:
        return False
    if (first in _PREPOSITIONS and not _BOUND.match(value)) or _participle(first):
        return False
    if any(w in _FINITE or w in TRANSIENT_WORDS or w in ("still", "yet", "pending", "tbd") for w in lowered):
        return False
    for word in words:
        if any(ch.isdigit() for ch in word) or re.search(r"\w[_./]\w|^[\"'`\u201c]", word):
            return True
        if any(ch.isupper() for ch in word) and word.lower() not in PRONOUNS and word != "I":  # "iOS 17", "en-US"
            return True
    return False


def _names_all(phrase: str) -> bool:
    values = _values(phrase, plural=True)
    return bool(values) and all(v[:1].isupper() or any(ch.isdigit() for ch in v) for v in values)


def _values(text: str, *, plural: bool) -> list[str]:
    """The value (or, for a plural slot, the values of a list) a statement gives; [] when it is a clause."""
    value = _PAREN.sub("", text).strip()
    value = _VALUE_END.sub("", value).strip(" ,.;:")
    value = _TRAILING_TIME.sub("", value).strip(" ,.;:")
    if not value or _is_clause(value):
        return []
    words = value.lower().split()
    first = words[0]
    bounded = _BOUND.match(value) is not None and any(ch.isdigit() for ch in value)
    if not bounded and (
        first in _PREPOSITIONS or _participle(first) or first in _VALUE_FIRST_REJECTS or first in STATE_WORDS
    ):
        return []
    if first in ("a", "an") or any(_participle(w) for w in words[1:-1]):
        return []  # "a ledger daemon": what it is, not a value; "the API returned 429s": a clause
    if any(w.lower() in ("still", "yet", "pending", "tbd") for w in value.split()):
        return []
    parts = [p.strip(" .") for p in _LIST_SPLIT.split(value)] if plural else [value]
    parts = [p for p in parts if p]
    if not parts or len(parts) > MAX_LIST_VALUES:
        return []
    if len(parts) > 1 and any(len(p.split()) > 4 for p in parts):
        parts = [value]  # "a, b and c" of long parts is a sentence, not a list
    if any(len(p.split()) > MAX_OPEN_VALUE_WORDS for p in parts):
        return []
    return parts


def _is_clause(text: str) -> bool:
    lowered = [w.strip(",.;:") for w in text.lower().split()]
    if not lowered:
        return False
    if lowered[0] in PRONOUNS and lowered[0] not in ("this", "that"):
        return True
    return any(w in _FINITE for w in lowered)


def _slot(phrase: str, heading: str | None, minute: _Said) -> tuple[str, str] | None:
    """(subject, attribute) of an open slot phrase: ``A of/for/in S``, ``S's A``, or under a heading (heading, phrase),
    else (phrase, `VALUE`)."""
    phrase = _PAREN.sub("", phrase).strip(" ,:")
    if ":" in phrase:
        return None
    closed = parse_slot(phrase, minute.vocabulary)
    if closed is not None and _subject(closed[0], minute):
        return closed
    lowered = phrase.lower()
    if "'s " in lowered:
        owner, _, rest = lowered.partition("'s ")
        subject, attribute = _subject(owner, minute), _attribute(rest, minute)
        return (subject, attribute) if subject and attribute else None
    match = _OF.search(phrase)
    if match:
        attribute, subject = _attribute(phrase[: match.start()], minute), _subject(phrase[match.end() :], minute)
        if attribute and subject:
            return subject, attribute
        # "Code freeze for every train": what is named is the code freeze
        subject = _subject(phrase[: match.start()], minute)
        return (subject, VALUE) if subject and not heading else None
    if heading and not _IDENTIFIER.search(phrase):
        attribute = _attribute(phrase, minute)
        return (heading, attribute) if attribute else None
    if normalize_attribute(phrase, minute.vocabulary):
        return None  # "the database is Postgres": whose?
    words = phrase.split()
    if len(words) > 1 and _IDENTIFIER.fullmatch(words[-1]) and not _IDENTIFIER.search(" ".join(words[:-1])):
        # "Android minSdk": the Android app's minSdk, one slot with "Android: minSdk 24"
        subject = _subject(" ".join(words[:-1]), minute)
        return (subject, words[-1].lower()) if subject else None
    subject = _subject(phrase, minute)
    return (subject, VALUE) if subject else None


def _subject(phrase: str, minute: _Said) -> str | None:
    phrase = _PAREN.sub("", phrase)  # "Production database access (RDS and the warehouse)"
    said = phrase.strip().split()
    if not said or said[0].lower() in _OWN_WORDS:
        return None
    if said[0].lower() in PRONOUNS and not (said[0].lower() in _DEMONSTRATIVES and len(said) > 1):
        return None  # before normalizing: "we" is the scope there; "this audit" is the audit
    words = normalize_subject(phrase).split()
    if not words or words[0] in _OWN_WORDS or words[0] in PRONOUNS or words[0] in _QUANTIFIERS:
        return None
    if words[0].endswith("ing") and words[0] not in _ING_NOUNS:
        return None  # "running migrations during business hours", "rolling back": an activity, not a thing
    subject = normalize_subject(_LEADING_MODIFIERS.sub("", normalize_subject(phrase)))
    parts = subject.split()
    if not parts or len(parts) > MAX_OPEN_SUBJECT_WORDS or any(w in _FINITE for w in parts) or ":" in subject:
        return None
    if subject == minute.agent_id or any(w in PRONOUNS - {"this"} for w in parts):
        return None
    if any(_participle(w) for w in parts[1:]):
        return None  # "reviewer reviewed a small": a clause, not a name
    return subject


def _attribute(phrase: str, minute: _Said) -> str | None:
    words = _LEADING_MODIFIERS.sub("", normalize_subject(phrase)).split()
    if not words or len(words) > MAX_LABEL_WORDS or words[0] in PRONOUNS or any(w in _FINITE for w in words):
        return None
    text = " ".join(words)
    return normalize_attribute(text, minute.vocabulary) or text


def _of_head(label: str) -> str:
    match = _OF.search(label)
    return (label[: match.start()] if match else label).lower().split()[-1]


def _plural(word: str) -> bool:
    return len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "sis"))


def _verb_form(word: str) -> bool:
    """A word that can only be a verb here: "runs", "reviewed", "rotate(s)"."""
    return word.endswith(("s", "ed")) or word in ("run", "happen", "ship", "meet", "rotate", "release", "deploy")


def _inflected(verb: str) -> bool:
    """A change verb in a form that only a verb takes ("bumped", "moves", "set"), not the noun ("a change")."""
    return verb.endswith(("ed", "s", "ing")) or verb in ("set", "cut", "went", "rolled back", "pinned", "back")


def _participle(word: str) -> bool:
    return len(word) > 4 and word.endswith("ed")


# Each shape, in order, with the words it turns on (None: any sentence): a cheap test before its patterns.
_SHAPES: tuple[tuple[Callable[[str, str | None, _Said], list[Reading]], re.Pattern[str] | None], ...] = (
    (_ownership, re.compile(r"\bown|\bhand|\bpass|\bgiv|\bgave\b|\btransfer|\breassign|\btak|\btook\b|\bmine\b")),
    (_ready_by, re.compile(r"\s(?:by|before|than)\s+(?:\d|noon|midnight)")),  # before the label: "S: fresh by 06:00"
    (_labelled, re.compile(r":")),
    (_swap, re.compile(r"\bswap|\breplac|\b(?:moved|moving|migrated|migrating|switched|switching)\s+(?:off|away)\b")),
    (_arrow, re.compile(r"\u2192|->|=>")),
    (_rated, re.compile(r"rated\s")),  # before the change verbs: "re-rated to medium risk" is the rating's change
    (_added, re.compile(r"\badd(?:ing|ed|s)?\s")),  # before the change verbs: "adding X to Y" adds, it changes nothing
    (_change, re.compile(r"\sto\s")),
    (_dated_by, re.compile(r"\s(?:by|before|on|than)\s")),
    (_cadence, re.compile(r"ly\s|every\s|twice\s")),
    (_located, re.compile(r"\slives?\s|\s(?:kept|stored|hosted)\s")),
    (_kept_for, re.compile(r"\s(?:kept|retained|stored|held)\s+for\s")),
    (_stays_on, re.compile(r"\s(?:stays?|remains?|running|run)\s+(?:on|in)\s")),
    (_rolled_out, re.compile(r"%")),
    (_within, re.compile(r"\swithin\s")),
    (_needs, re.compile(r"\s(?:needs?|requires?|must\s+have)\s")),
    (_passive, re.compile(r"\s(?:by|with|from|through|via|in|at)\s")),
    (_copula, re.compile(r"\s(?:is|are|will\s+be)\s")),
)
