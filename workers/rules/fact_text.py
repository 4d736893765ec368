"""How a sentence states a fact: the text rules of the rule extractor, and the slot normalization they share.

`read()` takes one sentence of a minute and returns what it states, or None:
the sentence is cleaned (contractions expanded, a speaker or a label such as
"FYI:" or "decision:" dropped, a "starting tomorrow" read as the day it holds
from), then `TEXT_RULES` try it in order and the first that fits reads it.
Pure functions of the sentence, the minute and the time it was said.

The normalization (`normalize_subject`, `normalize_attribute`, `parse_slot`,
`clean_value`, `value_key`) is what makes two wordings of one statement land
in one slot with one value; docs/extraction.md has the tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import NamedTuple

from contracts import Minute
from contracts.facts import FactType
from workers.rules.relative_dates import INTRODUCED, RELATIVE, day_of, ground_in_text

# -- the tables ---------------------------------------------------------------------------


# Attributes a rule can read a slot from: canonical name -> the ways people say it. A statement about an
# attribute not listed here is left to the LLM extractor (workers.facts.extraction.RuleExtractor(attributes=...)
# adds more).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "database": ("database", "db", "datastore", "data store", "primary database"),
    "cache": ("cache", "cache backend", "caching layer", "cache layer"),
    "queue": ("queue", "message queue", "message broker", "broker", "job queue"),
    "search_engine": ("search engine",),
    "storage": ("storage", "object storage", "blob storage", "file storage"),
    "language": ("language", "programming language"),
    "framework": ("framework", "web framework"),
    "runtime": ("runtime",),
    "orm": ("orm",),
    "package_manager": ("package manager",),
    "build_tool": ("build tool", "build system"),
    "protocol": ("protocol", "wire protocol"),
    "format": ("format", "file format", "serialization format"),
    "log_format": ("log format",),
    "version": ("version", "pinned version"),
    "ttl": ("ttl", "time-to-live", "time to live", "expiry"),
    "session_ttl": ("session ttl", "session time-to-live", "session time to live", "session lifetime"),
    "token_ttl": ("token ttl", "token lifetime", "token expiry"),
    "cache_ttl": ("cache ttl",),
    "timeout": ("timeout", "time limit"),
    "request_timeout": ("request timeout",),
    "connect_timeout": ("connect timeout", "connection timeout"),
    "idle_timeout": ("idle timeout",),
    "session_timeout": ("session timeout",),
    "max_retries": ("max retries", "maximum retries", "retry limit", "retry count", "retries", "number of retries"),
    "backoff": ("backoff", "retry backoff"),
    "owner": ("owner", "owning team", "maintainer", "code owner"),
    "on_call": ("on-call", "on call", "oncall", "on-call rotation"),
    "tech_lead": ("tech lead",),
    "region": ("region", "cloud region", "aws region"),
    "zone": ("availability zone", "zone"),
    "cloud": ("cloud provider", "cloud"),
    "hosting": ("hosting", "hosting provider"),
    "replicas": ("replicas", "replica count", "number of replicas"),
    "instance_type": ("instance type", "machine type"),
    "concurrency": ("concurrency", "worker count", "number of workers"),
    "pool_size": ("pool size", "connection pool size"),
    "memory_limit": ("memory limit",),
    "cpu_limit": ("cpu limit",),
    "disk_size": ("disk size", "volume size"),
    "log_level": ("log level", "logging level"),
    "rate_limit": ("rate limit",),
    "batch_size": ("batch size",),
    "page_size": ("page size",),
    "port": ("port",),
    "url": ("url", "base url", "endpoint"),
    "retention": ("retention", "retention period", "data retention"),
    "backup_schedule": ("backup schedule", "backup frequency"),
    "schedule": ("schedule",),
    "deploy_window": ("deploy window", "deployment window", "release window"),
    "release_cadence": ("release cadence",),
    "deadline": ("deadline", "due date"),
    "budget": ("budget",),
    "sla": ("sla",),
    "slo": ("slo",),
    "auth_method": ("auth method", "authentication method"),
    "encryption": ("encryption",),
    "default_branch": ("default branch", "main branch"),
    "release_branch": ("release branch",),
    "cdn": ("cdn",),
    "dns_provider": ("dns provider",),
    "email_provider": ("email provider",),
    "payment_provider": ("payment provider",),
    "monitoring": ("monitoring", "monitoring tool"),
    "ci": ("ci", "ci system"),
    "license": ("license",),
    "tool": ("tool",),
}


# The subject that stands for everyone in the tier ("we must not...", "never ...", "our goal is ...").
SCOPE_SUBJECT = "scope"
SCOPE_WORDS = frozenset(
    {"we", "you", "everyone", "everybody", "all agents", "agents", "every agent", "each agent", "team", "all of us"}
)
# Words that make a phrase no subject: whoever "it" is, the rules cannot tell.
PRONOUNS = frozenset(
    {
        "i", "me", "my", "you", "your", "he", "him", "his", "she", "her", "it", "its", "we", "us", "our", "they",
        "them", "their", "this", "that", "these", "those", "there", "here", "someone", "anyone", "something",
        "anything", "nothing", "nobody", "what", "which", "who", "whom", "how", "why", "when", "where",
    }
)  # fmt: skip
# Words a component's name ends with: in "reporting job queue" the head "job" belongs to the subject.
SUBJECT_HEADS = frozenset(
    {
        "service", "services", "job", "jobs", "worker", "workers", "api", "app", "page", "pipeline", "console",
        "gateway", "cluster", "indexer", "frontend", "backend", "server", "daemon", "bot", "agent", "module",
    }
)  # fmt: skip
DETERMINERS = ("the", "a", "an", "our", "their", "its", "this", "that", "these", "those", "my", "your", "his", "her")
# A value that starts with one of these reports a passing state, not a fact ("the billing DB is slow today").
STATE_WORDS = frozenset(
    {
        "slow", "fast", "down", "up", "broken", "flaky", "fine", "ok", "okay", "green", "red", "healthy",
        "unhealthy", "busy", "full", "empty", "done", "ready", "great", "bad", "good", "late", "stuck", "back",
        "out", "unavailable", "degraded", "overloaded", "failing", "working", "live", "dead", "wrong", "correct",
        "missing", "unknown", "unclear", "weird", "clear", "high", "low", "not", "no", "still", "being", "getting",
        "going", "in", "on", "off", "at", "under", "almost", "nearly", "probably", "definitely", "really", "so",
        "too", "very", "pretty", "quite",
    }
)  # fmt: skip
TRANSIENT_WORDS = frozenset({"today", "tonight", "now", "asap", "again", "yet", "anymore", "currently", "temporarily"})
# "X is a Y" about a name: a Y that starts with one of these judges X rather than classifying it.
EVALUATIVE_WORDS = frozenset(
    {
        "bit", "little", "lot", "mess", "pain", "problem", "issue", "bug", "joke", "disaster", "good", "bad",
        "great", "nice", "real", "huge", "big", "total", "known", "blocker", "question", "mystery", "fast",
        "slow", "quick", "tough", "hard", "easy", "fan", "pleasure", "must", "priority", "risk", "shame", "mistake",
    }
)  # fmt: skip
# Verbs whose "cannot" is about ability, not a rule ("I cannot reproduce it"); "log in", "sign on" too.
ABILITY_VERBS = frozenset(
    {
        "reproduce", "find", "see", "tell", "figure", "understand", "reach", "connect", "get", "say", "remember",
        "wait", "believe", "imagine", "load", "open", "start", "access", "login", "seem", "work",
        "keep", "help", "hear", "read", "stand", "afford", "decide", "explain", "attend",
    }
)  # fmt: skip
# Base forms of verbs an instruction starts with ("never deploy ...", "when X, restart ...").
VERBS = frozenset(
    {
        "add", "allow", "apply", "approve", "archive", "ask", "assign", "avoid", "back", "backfill", "block",
        "branch", "bump", "cache", "call", "cancel", "change", "check", "cherry-pick", "clean", "clear", "close",
        "commit", "compress", "configure", "confirm", "copy", "create", "cut", "deactivate", "delete", "deploy",
        "depend", "describe", "detach", "disable", "document", "downgrade", "drain", "drop", "edit", "email", "emit",
        "enable", "encrypt", "escalate", "exceed", "expand", "expose", "export", "extend", "fail", "fetch", "file",
        "fix", "flush", "follow", "force", "force-push", "freeze", "get", "give", "grant", "hardcode", "hold",
        "ignore", "import", "increase", "inform", "install", "invalidate", "keep", "kill", "label", "leave",
        "limit", "lock", "log", "look", "lower", "make", "mark", "merge", "migrate", "mirror", "monitor", "move",
        "mute", "notify", "open", "page", "patch", "pause", "pin", "ping", "post", "promote", "prune", "publish",
        "pull", "purge", "push", "put", "raise", "rebase", "reboot", "rebuild", "recreate", "redeploy", "reduce",
        "refresh", "regenerate", "reindex", "release", "reload", "remove", "rename", "renew", "reopen", "repair",
        "replay", "replace", "report", "request", "require", "rerun", "reset", "resize", "restart", "restore",
        "resume", "retry", "return", "reuse", "revert", "review", "revoke", "roll", "rotate", "run", "save",
        "scale", "schedule", "send", "set", "share", "ship", "shut", "sign", "skip", "snapshot", "split", "start",
        "stop", "store", "support", "suspend", "switch", "sync", "tag", "take", "tell", "test", "throttle",
        "toggle", "touch", "trigger", "truncate", "turn", "unblock", "undo", "unlock", "update", "upgrade",
        "upload", "use", "validate", "verify", "wait", "warn", "watch", "wipe", "write",
    }
)  # fmt: skip
# Participles "must be" takes in a rule ("backups must be encrypted"); any other "must be X" is a guess.
_PARTICIPLE_ENDINGS = ("ed", "en", "wn")
_IRREGULAR_PARTICIPLES = frozenset({"kept", "run", "done", "made", "set", "built", "held", "put", "sent", "cut"})

# Leading labels: the rest of the sentence is read as usual; a decision label makes a plain statement a decision.
_DECISION_LABELS = frozenset(
    {"decision", "decided", "agreed", "resolution", "resolved", "final decision", "decision made", "changing course"}
)
_GOAL_LABELS = frozenset({"goal", "objective"})
_LABELS = _DECISION_LABELS | _GOAL_LABELS | {
    "fyi", "note", "update", "heads up", "heads-up", "reminder", "psa", "btw", "fact", "til", "context", "info",
    "lesson", "lesson learned", "lessons learned", "learned", "takeaway", "rule", "policy", "constraint",
    "runbook", "procedure", "how-to", "howto", "for the record", "quick note",
}  # fmt: skip
# Leading phrases that say a value changes from here on (a hint that it supersedes).
_CHANGE_LEADS = ("going forward", "from now on", "henceforth", "as of now", "effective now")
# Leading phrases that report a check of what follows ("just confirmed the API's timeout is 30s"): dropped.
_AGREED_THAT = re.compile(r"^(?:we|the\s+team)\s+(?:have\s+)?(?:agreed|decided)\s+that\s+(?P<rest>.+)$", re.I)
_CHECKED_LEAD = re.compile(
    r"^(?:(?:i\s+)?(?:just\s+|have\s+|double[\s-]?)?(?:confirmed|checked|verified)(?:\s+that)?|i\s+can\s+confirm(?:\s+that)?)\s+"
    r"(?=\S)",
    re.I,
)
# A trailing attribution says where the statement comes from, not what the value is ("…is 5, per the runbook").
# A trailing aside to the reader ("…, for anyone new", "…, FYI") or since-when ("… since the last deploy").
_ASIDE = re.compile(
    r"(?:\s*,\s*(?:for\s+(?:anyone|everyone|context|reference|the\s+record|what\s+it'?s\s+worth)|fyi|btw|"
    r"just\s+so\s+you\s+know|(?:as\s+)?(?:decided|agreed)(?:\s+(?:in|at|on|by)\s+[^,]+)?)\b[^,:]*|\s+since\s+(?:the\s+)?(?:last|latest|recent)\s+[a-z]+(?:\s+[a-z]+)?)$",
    re.I,
)
_PARENTHETICAL = re.compile(r"\s*\([^()]{1,40}\)$")  # "… can't Y (policy)": an aside
_ATTRIBUTION = re.compile(r"^(?P<rest>.+?),\s*(?:as\s+)?(?:per|according\s+to)\s+[^,]{1,60}$", re.I)
MAX_VALUE_WORDS = 8  # an attribute's value longer than this is a sentence, not a value
MAX_SUBJECT_WORDS = 5
MAX_PHRASE_WORDS = 16  # a constraint's, goal's or procedure's action
MAX_CONDITION_WORDS = 10  # a procedure's condition
# A sentence longer than this is not read: no statement the rules read is near it, and a hostile note of one
# 64 KB "sentence" would cost the backtracking patterns seconds.
MAX_SENTENCE_CHARS = 500


# -- normalization ------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")
# Typographic quotes and dashes as ASCII (a note typed on a phone reads like one typed in a terminal).
_QUOTES = str.maketrans(
    {"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "`": "", "\u2014": "-", "\u2013": "-"}
)
_NOT_SUBJECT = re.compile(r"[^0-9a-z_.:/\- ]+")
_NUMBER_WORDS = {
    "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8",
    "nine": "9", "ten": "10", "twelve": "12", "fifteen": "15", "twenty": "20", "thirty": "30", "sixty": "60",
}  # fmt: skip
_UNITS = {
    "ms": "millisecond", "millisecond": "millisecond", "milliseconds": "millisecond",
    "s": "second", "sec": "second", "secs": "second", "second": "second", "seconds": "second",
    "m": "minute", "min": "minute", "mins": "minute", "minute": "minute", "minutes": "minute",
    "h": "hour", "hr": "hour", "hrs": "hour", "hour": "hour", "hours": "hour",
    "d": "day", "day": "day", "days": "day", "w": "week", "wk": "week", "week": "week", "weeks": "week",
    "mo": "month", "month": "month", "months": "month", "y": "year", "yr": "year", "year": "year", "years": "year",
}  # fmt: skip
_DURATION = re.compile(
    r"\b(?P<n>\d+|"
    + "|".join(_NUMBER_WORDS)
    + r")\s*(?P<unit>"
    + "|".join(sorted(_UNITS, key=len, reverse=True))
    + r")\b",
    re.IGNORECASE,
)
_TRAILING_FILLER = re.compile(
    r"(?:\s*,)?\s+(?:now|for now|from now on|going forward|again|as well|too|anymore|these days|currently|then|"
    r"by default|for good|this morning|this afternoon|this evening|earlier today|last night|here)$",
    re.IGNORECASE,
)


def _words(text: str) -> str:
    return _SPACES.sub(" ", text.translate(_QUOTES)).strip()


def _strip_determiner(text: str) -> str:
    head, _, rest = text.partition(" ")
    return rest if rest and head.lower() in DETERMINERS else text


def normalize_subject(text: str) -> str:
    """A subject as a slot holds it: lower case, no leading determiner or possessive, single spaces.

    ``The Billing Service's`` -> ``billing service``; ``we`` / ``everyone`` ->
    ``scope``; ``this task`` -> ``task``.
    """
    text = _words(text).lower().rstrip(".,;:!")
    if text.endswith("'s"):
        text = text[:-2]
    text = _strip_determiner(_NOT_SUBJECT.sub(" ", text.replace("'", "")).strip())
    text = _SPACES.sub(" ", text).strip()
    if text in SCOPE_WORDS:
        return SCOPE_SUBJECT
    if text in ("task", "current task"):
        return "task"
    return text


def normalize_attribute(text: str, vocabulary: Mapping[str, str] | None = None) -> str | None:
    """The canonical name of an attribute phrase (``DB`` -> ``database``), or None when it is not one."""
    phrase = _strip_determiner(_words(text).lower().rstrip(".,;:!"))
    phrase = re.sub(r"^(?:current|present)\s+", "", phrase)  # "the current DB" names the DB
    table = _SURFACES if vocabulary is None else vocabulary
    return table.get(phrase) or table.get(phrase.replace("_", " "))


def clean_value(text: str) -> str:
    """A stated value, tidied: no quotes, outer punctuation, leading article or trailing "now"; a value that is a
    duration or a number word in one form (``8h`` / ``eight hours`` -> ``8 hours``, ``three`` -> ``3``)."""
    value = _outer_stripped(_words(text))
    previous = None
    while previous != value:
        previous = value
        value = _outer_stripped(_TRAILING_FILLER.sub("", value))
    value = _strip_determiner(value) if value.split(" ", 1)[0].lower() in ("the", "a", "an") else value
    duration = _DURATION.fullmatch(value)  # only a whole value: "below 200 ms" in a goal stays as written
    if duration:
        value = _duration(duration)
    return _NUMBER_WORDS.get(value.lower(), value)


def _outer_stripped(value: str) -> str:
    """Outer punctuation off; a closing parenthesis only when it closes nothing ("iPhone SE (3rd gen)" keeps it)."""
    while True:
        stripped = value.strip(" .,;:!\"'(")
        if stripped.endswith(")") and stripped.count("(") >= stripped.count(")"):
            return stripped
        stripped = stripped.rstrip(")")
        if stripped == value:
            return stripped
        value = stripped


def value_key(text: str) -> str:
    """What two values must share to be the same value: `clean_value`, case-folded."""
    return clean_value(text).casefold()


def _duration(match: re.Match[str]) -> str:
    n = match.group("n").lower()
    n = _NUMBER_WORDS.get(n, n)
    unit = _UNITS[match.group("unit").lower()]
    return f"{n} {unit}" + ("" if n == "1" else "s")


def _surfaces(attributes: Mapping[str, Iterable[str]]) -> dict[str, str]:
    table: dict[str, str] = {}
    for name, phrases in attributes.items():
        table[name.replace("_", " ")] = name
        for phrase in phrases:
            table[phrase.lower()] = name
            table[phrase.lower().replace("-", " ")] = name
    return table


_SURFACES = _surfaces(ATTRIBUTES)


# -- sentences ------------------------------------------------------------------------------

# A sentence ends at . ! ? ; and any closing quotes or brackets after it ('... ready?" she asked').
_CLOSERS = "\"'\u201d\u2019)\\]\u00bb"
_SENTENCES = re.compile(rf"(?:(?<=[.!?;])|(?<=[.!?;][{_CLOSERS}])|(?<=[.!?;][{_CLOSERS}][{_CLOSERS}]))\s+|\n+")
_ASKS = re.compile(rf"\?[{_CLOSERS}\s]*$")
_CONTRACTIONS = (
    (re.compile(r"\b(can)'t\b", re.I), "cannot"),
    (re.compile(r"\b(won)'t\b", re.I), "will not"),
    (re.compile(r"\b(\w+)n't\b", re.I), r"\1 not"),
    (re.compile(r"\b(we|they|you|i)'d\b", re.I), r"\1 would"),
    (re.compile(r"\b(we|they|you)'re\b", re.I), r"\1 are"),
    (re.compile(r"\b(we|they|you|i)'ll\b", re.I), r"\1 will"),
    (re.compile(r"\b(we|they|you|i)'ve\b", re.I), r"\1 have"),
    (re.compile(r"\b(i)'m\b", re.I), r"\1 am"),
    (re.compile(r"\b(it|that|there|what|here|who)'s\b", re.I), r"\1 is"),
    (re.compile(r"\blet's\b", re.I), "let us"),
)
_QUESTION_START = re.compile(
    r"^(?:is|are|was|were|does|do(?!\s+not\b)|did|can|could|should|shall|will|would|what|which|who|whom|whose|where|why"
    r"|how(?!\s+to\b)|any\s+idea)\b",
    re.I,
)
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|might|could|would(?!\s+(?:rather|prefer))|should\s+we|shall\s+we|what\s+if|wonder\w*"
    r"|not\s+sure|unsure|propos\w*|suggest\w*|consider\w*|thinking\s+about|probably|i\s+guess|if\s+only"
    r"|someone\s+said|rumou?r\w*|hopefully|i\s+wish|hypothetical\w*|tbd|to\s+be\s+decided)\b",
    re.I,
)
_LABEL = re.compile(r"^(?P<label>[a-z][a-z \-]{1,20}?)\s*[:,]\s+(?P<rest>.+)$", re.I)
_LEADING_DATE = re.compile(
    rf"^(?:(?:starting|from|as\s+of|since|effective|beginning)\s+(?P<d1>{INTRODUCED})|(?P<d2>{RELATIVE}))\s*,?\s+"
    r"(?P<rest>.+)$",
    re.I,
)
_TRAILING_DATE = re.compile(
    rf"^(?P<rest>.+?)\s*[,-]?\s+(?:starting|from|as\s+of|since|effective|beginning|valid\s+from|in\s+effect\s+from|"
    rf"takes\s+effect|taking\s+effect)\s+(?P<d>{INTRODUCED})"
    r"(?:\s+on(?:wards?)?)?$",
    re.I,
)


class Reading(NamedTuple):
    """What the rules read from one sentence."""

    type: FactType
    subject: str
    attribute: str
    value: str
    rule: str  # the rule that read it: a key of workers.facts.extraction.RULE_CONFIDENCE
    supersedes: bool = False  # the sentence says the value replaces an earlier one
    valid_from: date | None = None  # the day a "starting tomorrow" names; None: from the minute
    decision_label: bool = False  # "decision: ...", "agreed: ..."
    single_valued: bool | None = None  # None: the contract's default for the type and attribute
    replaces: str | None = None  # the old value the sentence names as replaced ("swapping X for Y"): X


@dataclass(frozen=True, slots=True)
class _Context:
    """What the rules know about the sentence beyond its words."""

    minute: Minute
    at: datetime
    vocabulary: Mapping[str, str]
    goal_label: bool = False  # "goal: ...": the rest is the goal of the whole tier


def _expand(sentence: str) -> str:
    if "'" not in sentence:  # every contraction has one
        return sentence
    for pattern, replacement in _CONTRACTIONS:
        sentence = pattern.sub(replacement, sentence)
    return sentence


def asks_or_hedges(sentence: str) -> bool:
    """Whether the sentence asks (a question, however it is punctuated) or hedges (maybe, should we, a proposal)."""
    return bool(_ASKS.search(sentence) or _QUESTION_START.match(sentence) or _HEDGE.search(sentence))


# -- slot phrases ------------------------------------------------------------------------------

_OF = re.compile(r"\s+(?:of|for|on|in)\s+", re.I)
_DATE_PHRASE = re.compile(INTRODUCED, re.I)


def _subject_ok(subject: str, minute: Minute) -> bool:
    words = subject.split()
    if not words or len(words) > MAX_SUBJECT_WORDS:
        return False
    if subject == SCOPE_SUBJECT or subject == "task":
        return True
    if any(w in PRONOUNS for w in words) or subject == (minute.agent_id or "").lower():
        return False
    return _DATE_PHRASE.fullmatch(subject) is None  # "next friday" is when, not what


def parse_slot(phrase: str, vocabulary: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(subject, attribute) of a noun phrase naming one, or None.

    Three shapes, the attribute always one of `ATTRIBUTES`' phrases:
    ``the billing service's DB`` (possessive), ``the DB of/for the billing
    service``, and ``billing service DB`` (the longest attribute phrase at
    the end; what comes before is the subject).
    """
    table = _SURFACES if vocabulary is None else vocabulary
    text = _words(phrase).rstrip(".,;:!")
    lowered = text.lower()
    if "'s " in lowered:
        owner, _, rest = lowered.partition("'s ")
        attribute = normalize_attribute(rest, table)
        return (normalize_subject(owner), attribute) if attribute else None
    for match in _OF.finditer(lowered):
        attribute = normalize_attribute(lowered[: match.start()], table)
        if attribute:
            return normalize_subject(lowered[match.end() :]), attribute
    words = _strip_determiner(lowered).split()
    for size in (4, 3, 2, 1):
        if len(words) > size:
            attribute = table.get(" ".join(words[-size:]))
            shorter = table.get(" ".join(words[-size + 1 :])) if size > 1 else None
            if attribute and shorter and words[-size] in SUBJECT_HEADS:
                continue  # "reporting job queue": the job's queue, not the reporting's job queue
            if attribute:
                return normalize_subject(" ".join(words[:-size])), attribute
    return None


def _value_ok(value: str, max_words: int = MAX_VALUE_WORDS) -> bool:
    words = value.lower().split()
    if not words or len(words) > max_words:
        return False
    if words[0] in STATE_WORDS or words[0] in PRONOUNS:
        return False
    return not any(w.strip(",.") in TRANSIENT_WORDS for w in words) and not any(
        w in ("is", "are", "was", "were", "will", "would", "should", "must", "might", "could", "can") for w in words
    )


def _phrase_ok(phrase: str, minute: Minute) -> bool:
    """An action or a condition: short, about no one in particular, nothing passing."""
    words = [w.strip(",.") for w in phrase.lower().split()]
    if not words or len(words) > MAX_PHRASE_WORDS:
        return False
    if any(w in ("i", "me", "my", "i'm", "i'll", "mine") for w in words):
        return False
    return not any(w in ("today", "tonight", "asap", "now", "yet") for w in words)


def _starts_with_verb(phrase: str) -> bool:
    first = phrase.split(" ", 1)[0].lower().strip(",.")
    return first in VERBS


# -- the text rules -------------------------------------------------------------------------

_MODAL_NOT = (
    r"must\s+not|must\s+never|should\s+never|shall\s+not|shall\s+never|may\s+not|may\s+never"
    r"|(?:is|are)\s+not\s+allowed\s+to|(?:is|are)\s+never\s+allowed\s+to|(?:is|are)\s+forbidden\s+to"
)
_MUST_NOT = re.compile(rf"^(?P<s>[^,;:]+?)\s+(?P<m>{_MODAL_NOT}|cannot|can\s+not)\s+(?:ever\s+)?(?P<v>.+)$", re.I)
_MUST = re.compile(r"^(?P<s>[^,;:]+?)\s+(?:must\s+always|must|shall\s+always|shall)\s+(?P<v>.+)$", re.I)
_NEVER = re.compile(r"^(?:please\s+)?(?:never(?:\s+ever)?|do\s+not(?:\s+ever)?)\s+(?P<v>.+)$", re.I)
# "everyone has to Y", "we can never Y": the whole scope's rule
_SCOPE_MUST = re.compile(r"^(?:everyone|every\s+agent|all\s+of\s+us|we\s+all)\s+(?:has|have)\s+to\s+(?P<v>.+)$", re.I)
_SCOPE_NEVER = re.compile(r"^we\s+(?:can|may|must|should)\s+never\s+(?P<v>.+)$", re.I)
# "S always needs to Y", "S needs to Y, always"
_NEEDS_ALWAYS = re.compile(
    r"^(?P<s>[^,;:]+?)\s+(?:always\s+needs\s+to\s+(?P<v1>.+)|needs\s+to\s+(?P<v2>.+?),\s*always)$", re.I
)
_ALWAYS = re.compile(r"^always\s+(?P<v>.+)$", re.I)
_NOBODY = re.compile(
    r"^(?:no\s+one|nobody|no\s+agent|no\s+service)\s+(?:may|can|should|must|is\s+allowed\s+to|gets\s+to)\s+(?P<v>.+)$",
    re.I,
)
_FORBIDDEN = re.compile(r"^it\s+is\s+(?:forbidden|not\s+allowed|prohibited|not\s+permitted)\s+to\s+(?P<v>.+)$", re.I)


# "Don't give up", "never stop trying", "always believe in yourself": encouragement between people, not a rule of
# the tier (LoCoMo's dialogue stored "Don't give up" as a project-wide must_not).
_ENCOURAGEMENT = re.compile(
    r"^(?:give\s+up|stop\s+(?:believing|dreaming|trying|learning|smiling)|lose\s+(?:hope|heart|faith|sight)"
    r"|believe\s+in|doubt\s+yourself|beat\s+yourself|be\s+(?:afraid|sorry|shy|a\s+stranger|so\s+hard)"
    r"|forget\s+(?:to\s+(?:smile|breathe|have\s+fun|take\s+care)|about\s+(?:yourself|me|us)))\b",
    re.I,
)
_PERMITTED = re.compile(r"^be\s+(?:allowed|permitted)\s+to\s+", re.I)  # "must not be allowed to X": must not X


def _constraint(s: str, ctx: _Context) -> Reading | None:
    lowered = s.lower()
    if not any(
        w in lowered
        for w in ("must", "never", "not", "shall", "may", "always", "cannot", "forbidden", "has to", "have to")
    ):
        return None
    for pattern in (_NEVER, _ALWAYS):
        match = pattern.match(s)
        if match:
            value = match.group("v")
            if not _starts_with_verb(value) or not _phrase_ok(value, ctx.minute) or _ENCOURAGEMENT.match(value):
                return None
            attribute = "must_not" if pattern is _NEVER else "must"
            return Reading(FactType.CONSTRAINT, SCOPE_SUBJECT, attribute, value, "constraint_imperative")
    for pattern in (_NOBODY, _FORBIDDEN, _SCOPE_NEVER):
        match = pattern.match(s)
        if match and _phrase_ok(match.group("v"), ctx.minute):
            return Reading(FactType.CONSTRAINT, SCOPE_SUBJECT, "must_not", match.group("v"), "constraint_must_not")
    match = _SCOPE_MUST.match(s)
    if match and _starts_with_verb(match.group("v")) and _phrase_ok(match.group("v"), ctx.minute):
        return Reading(FactType.CONSTRAINT, SCOPE_SUBJECT, "must", match.group("v"), "constraint_must")
    match = _NEEDS_ALWAYS.match(s)
    if match:
        subject, value = normalize_subject(match.group("s")), match.group("v1") or match.group("v2")
        if _subject_ok(subject, ctx.minute) and _starts_with_verb(value) and _phrase_ok(value, ctx.minute):
            return Reading(FactType.CONSTRAINT, subject, "must", value, "constraint_must")
        return None
    match = _MUST_NOT.match(s)
    attribute, rule = "must_not", "constraint_must_not"
    if match and match.group("m").lower().startswith("can"):
        rule = "constraint_cannot"
        if _ABILITY.match(match.group("v")):
            return None
    if match is None:
        match = _MUST.match(s)
        attribute, rule = "must", "constraint_must"
    if match is None:
        return None
    subject, value = normalize_subject(match.group("s")), _PERMITTED.sub("", match.group("v"))
    if subject == "i" or not _subject_ok(subject, ctx.minute) or not _phrase_ok(value, ctx.minute):
        return None
    first, _, rest = value.partition(" ")
    if first.lower() in ("have", "be") and (
        first.lower() == "have" or not _is_participle(rest.split(" ", 1)[0] if rest else "")
    ):
        return None  # "must have failed", "must be careful": a guess, not a rule
    if next((w for w in value.lower().split() if w not in _INTENSIFIERS), "") in _FEELINGS:
        return None  # "you must love seeing how you've grown", "you must really miss them": a guess at a feeling
    return Reading(FactType.CONSTRAINT, subject, attribute, value, rule)


_FEELINGS = frozenset({"love", "enjoy", "feel", "miss", "hate", "adore"})
_INTENSIFIERS = frozenset({"really", "so", "just", "truly", "definitely", "totally", "absolutely", "surely"})


_ABILITY = re.compile(rf"^(?:(?:{'|'.join(sorted(ABILITY_VERBS))})\b|(?:log|sign)\s+(?:in|on|into)\b)", re.I)


def _is_participle(word: str) -> bool:
    word = word.lower().strip(",.")
    return word.endswith(_PARTICIPLE_ENDINGS) or word in _IRREGULAR_PARTICIPLES


_PURPOSE = re.compile(r"^(?:in\s+order\s+)?to\s+(?P<c>[^,]+?),\s*(?P<a>.+)$", re.I)
_HOW_TO = re.compile(r"^(?:here's\s+how|here\s+is\s+how|how|steps)\s+to\s+(?P<c>[^:]+?):\s*(?P<a>.+)$", re.I)
_TRIGGER_FIRST = re.compile(
    r"^(?P<k>whenever|when|if(?:\s+ever)?|once|before|after|each\s+time|every\s+time)\s+(?P<c>[^,:]+?)[,:]\s*"
    r"(?:then\s+)?(?P<a>.+)$",
    re.I,
)
_TRIGGER_LAST = re.compile(
    r"^(?P<a>.+?)\s+(?P<k>whenever|when|if|before|after|each\s+time|every\s+time)\s+(?P<c>.+)$", re.I
)
_NEED_TO = re.compile(r"^(?:you|we)\s+(?:need|want|have)\s+to\s+", re.I)
_ACTION_LEAD = re.compile(r"^(?:(?:you|we)(?:\s+should|\s+just)?|please|just|always|then)\s+", re.I)


def _procedure(s: str, ctx: _Context) -> Reading | None:
    for pattern, rule in (
        (_HOW_TO, "procedure_purpose"),
        (_PURPOSE, "procedure_purpose"),
        (_TRIGGER_FIRST, "procedure_trigger"),
        (_TRIGGER_LAST, "procedure_trigger"),
    ):
        match = pattern.match(s)
        if match is None:
            continue
        condition = match.group("c").strip()
        action = _ACTION_LEAD.sub("", match.group("a").strip())
        kind = (match.groupdict().get("k") or "").lower()
        needed = _NEED_TO.match(condition)
        if needed:
            condition = condition[needed.end() :]
            rule = "procedure_purpose"
        if len(condition.split()) > MAX_CONDITION_WORDS or (len(condition.split()) < 2 and kind):
            return None
        if not _starts_with_verb(action) or not _phrase_ok(action, ctx.minute):
            return None
        if not _phrase_ok(condition, ctx.minute) or any(w in ("you", "your") for w in condition.lower().split()):
            return None
        subject = normalize_subject(condition)
        if kind in ("before", "after"):
            subject = f"{kind} {subject}"
        return Reading(FactType.PROCEDURE, subject, "action", action, rule)
    return None


_PREFER = re.compile(
    r"^(?:(?P<who>we|the\s+team|our\s+team|everyone|most\s+of\s+us)\s+(?:really\s+|generally\s+|usually\s+|tend\s+to\s+)?"
    r"(?:prefers?|would\s+prefer|would\s+rather(?:\s+use|\s+have)?|favou?rs?|leans?\s+towards?|likes?(?=\s+.+\s+better\s+than\s))"
    r"|prefer)\s+(?P<rest>.+)$",
    re.I,
)  # "prefer X for T" alone is an instruction to the reader: the team's preference
_PREFER_FOR = re.compile(
    r"^for\s+(?P<t>[^,]+),\s*(?:we|the\s+team)\s+(?:prefers?|would\s+rather(?:\s+use)?|favou?rs?)\s+(?P<v>.+)$", re.I
)
_PREFERENCE_IS = re.compile(r"^(?:our|the\s+team's|the)\s+preference\s+for\s+(?P<t>.+?)\s+is\s+(?P<v>.+)$", re.I)
_PREFERRED = re.compile(
    r"^(?P<v>.+?)\s+is\s+(?:preferred|the\s+preferred\s+(?:choice|option))\s+for\s+(?P<t>.+)$", re.I
)
# "our pick for T is V", "V is our go-to for T": a choice the team made for a kind of work.
_CHOICE_WORDS = r"(?:pick|choice|go-to|default|favou?rite)"
_FOR_PLEASE = re.compile(r"^for\s+(?P<t>[^,]+),\s*(?P<v>[^,]+?),?\s+please$", re.I)  # "for test data, fixtures please"
_PICK_IS = re.compile(rf"^(?:our|the\s+team's)\s+{_CHOICE_WORDS}\s+for\s+(?P<t>.+?)\s+is\s+(?P<v>.+)$", re.I)
_IS_PICK = re.compile(rf"^(?P<v>.+?)\s+is\s+(?:our|the\s+team's)\s+{_CHOICE_WORDS}\s+for\s+(?P<t>.+)$", re.I)
_ALTERNATIVE = re.compile(r"\s+(?:over|rather\s+than|better\s+than|than|instead\s+of|to)\s+.+$", re.I)


def _preference(s: str, ctx: _Context) -> Reading | None:
    lowered = s.lower()
    if not any(
        w in lowered
        for w in ("prefer", "rather", "favo", "better than", "pick", "choice", "go-to", "default", "please")
    ):
        return None
    topic = value = None
    match = _PREFER.match(s)
    if match:
        value, sep, topic = match.group("rest").partition(" for ")
        if not sep:
            return None
    else:
        for pattern in (_PREFER_FOR, _PREFERENCE_IS, _PREFERRED, _PICK_IS, _IS_PICK, _FOR_PLEASE):
            match = pattern.match(s)
            if match:
                topic, value = match.group("t"), match.group("v")
                break
    if topic is None or value is None:
        return None
    topic, value = _TRAILING_FILLER.sub("", _ALTERNATIVE.sub("", topic)), _ALTERNATIVE.sub("", value)
    subject = normalize_subject(topic)
    if not _subject_ok(subject, ctx.minute) or not _value_ok(value):
        return None
    return Reading(FactType.PREFERENCE, subject, "preference", value, "preference")


_GOAL_IS = re.compile(
    r"^(?:(?:our|the|a)\s+)?(?:(?:main|primary|new|current|next)\s+)?(?:goal|target|aim|objective)\s+(?:for|of)\s+"
    r"(?P<s>.+?)\s+is\s+(?:to\s+)?(?P<v>.+)$",
    re.I,
)
_GOAL_COLON = re.compile(
    r"^(?:(?:our|the|new|current)\s+)?(?:goal|target|objective|aim)\s+(?:for|with)\s+(?P<s>[^:]+?):\s*(?:to\s+)?(?P<v>.+)$",
    re.I,
)
# "for S, the aim is to X", "the plan for S is to X", "for S we want to X"
_FOR_S_GOAL = re.compile(
    r"^for\s+(?P<s>[^,]+),\s*(?:the|our)\s+(?:goal|aim|objective|plan)\s+is\s+to\s+(?P<v>.+)$", re.I
)
_PLAN_FOR = re.compile(r"^(?:the|our)\s+plan\s+for\s+(?P<s>.+?)\s+is\s+to\s+(?P<v>.+)$", re.I)
_FOR_S_WANT = re.compile(r"^for\s+(?P<s>[^,]+?),?\s+we\s+want\s+to\s+(?P<v>.+)$", re.I)
_GOAL_SUFFIX = re.compile(r"^(?P<s>[^:]+?)\s+(?:goal|target|objective):\s*(?:to\s+)?(?P<v>.+)$", re.I)
_GOAL_OURS = re.compile(
    r"^(?:our|the\s+team's)\s+(?:(?:main|primary)\s+)?(?:goal|objective)\s+is\s+(?:to\s+)?(?P<v>.+)$", re.I
)
_AIM = re.compile(
    r"^(?:we|the\s+team)\s+(?:aims?|are\s+aiming|are\s+trying|'re\s+trying)\s+to\s+(?P<v>.+)\s+(?:on|for)\s+(?P<s>(?:the\s+)?[^\s,]+(?:\s+[^\s,]+){0,3})$",
    re.I,
)


# "this PR", "that meeting": what the conversation points at, not a named thing (this task and this project are tiers).
_DEICTIC = re.compile(r"^(?:this|that|these|those)\s+(?!task\b|project\b)", re.I)


def _goal(s: str, ctx: _Context) -> Reading | None:
    if ctx.goal_label:
        return _goal_reading(SCOPE_SUBJECT, s, ctx)
    lowered = s.lower()
    if not any(w in lowered for w in ("goal", "target", "aim", "objective", "plan", "want to", "trying to")):
        return None
    for pattern in (_GOAL_IS, _GOAL_COLON, _GOAL_SUFFIX, _AIM, _FOR_S_GOAL, _PLAN_FOR, _FOR_S_WANT):
        match = pattern.match(s)
        if match:
            if _DEICTIC.match(match.group("s")):
                return None
            return _goal_reading(normalize_subject(match.group("s")), match.group("v"), ctx)
    match = _GOAL_OURS.match(s)
    return _goal_reading(SCOPE_SUBJECT, match.group("v"), ctx) if match else None


def _goal_reading(subject: str, value: str, ctx: _Context) -> Reading | None:
    value = re.sub(r"^to\s+", "", value.strip(), flags=re.I)
    if not _subject_ok(subject, ctx.minute) or not value or value.split(" ", 1)[0].lower() in STATE_WORDS:
        return None
    value = ground_in_text(value, ctx.at)
    return Reading(FactType.GOAL, subject, "goal", value, "goal") if _phrase_ok(value, ctx.minute) else None


_CHOICE = r"(?:use|go\s+with|adopt|switch\s+to|move\s+to|standardi[sz]e\s+on)"
_DECIDED = re.compile(
    rf"^(?:we\s+(?:have\s+)?|the\s+team\s+(?:has\s+)?)?(?:decided|agreed|chose|settled)\s+(?:to\s+{_CHOICE}|on)\s+"
    r"(?P<v>.+?)\s+(?:for|as)\s+(?P<np>.+)$",
    re.I,
)
_GOING_WITH = re.compile(
    rf"^(?:we\s+will|we\s+are\s+going\s+to|let\s+us|we\s+are)\s+(?:{_CHOICE}|going\s+with)\s+(?P<v>.+?)\s+(?:for|as)\s+"
    r"(?P<np>.+)$",
    re.I,
)
_SWITCH = re.compile(
    r"^(?:we\s+(?:(?:will|are|are\s+going\s+to|have|decided\s+to)\s+)?|let\s+us\s+)?"
    r"(?:switch(?:ing|ed)?|mov(?:e|ing|ed)|migrat(?:e|ing|ed))\s+(?P<np>.+?)\s+from\s+(?P<old>.+?)\s+to\s+(?P<v>.+)$",
    re.I,
)
_SWITCHES = re.compile(
    r"^(?P<np>.+?)\s+(?:moves?|switch(?:es)?|migrates?|is\s+moving|is\s+switching|is\s+migrating|goes)\s+"
    r"from\s+(?P<old>.+?)\s+to\s+(?P<v>.+)$",
    re.I,
)
_INSTEAD = re.compile(
    r"^(?:we\s+will\s+|let\s+us\s+|we\s+)?use\s+(?P<v>.+?)\s+instead\s+of\s+(?P<old>.+?)\s+(?:for|as)\s+(?P<np>.+)$",
    re.I,
)
_INSTEAD_LAST = re.compile(
    r"^(?:we\s+will\s+|let\s+us\s+|we\s+)?use\s+(?P<v>.+?)\s+(?:for|as)\s+(?P<np>.+?)\s+instead\s+of\s+(?P<old>.+)$",
    re.I,
)
_REPLACE = re.compile(
    r"^(?:we\s+(?:will\s+|decided\s+to\s+|have\s+)?|let\s+us\s+)?replac(?:e|ed|ing)\s+(?P<old>.+?)\s+with\s+"
    r"(?P<v>.+?)\s+(?:as|for)\s+(?P<np>.+)$",
    re.I,
)


_REPLACES = re.compile(r"^(?P<v>.+?)\s+replaces\s+(?P<old>.+?)\s+(?:as|for)\s+(?P<np>.+)$", re.I)
_WE_SWITCHED = re.compile(r"^we\s+(?:switched|moved|migrated)\s+(?P<np>.+?)\s+(?:over\s+)?to\s+(?P<v>.+)$", re.I)
_THE_CALL = re.compile(r"^the\s+(?:call|verdict)\s+is\s+(?P<v>.+?)\s+for\s+(?P<np>.+)$", re.I)
_GOES_INSTEAD = re.compile(r"^(?P<np>.+?)\s+goes\s+to\s+(?P<v>.+?)\s+instead\s+of\s+(?P<old>.+)$", re.I)
_IT_IS = re.compile(r"^(?P<v>.+?)\s+it\s+is\s+for\s+(?P<np>.+)$", re.I)  # "Postgres it is for the billing DB"
_OUT_IN = re.compile(r"^(?P<np>[^:]+?):\s*(?P<old>.+?)\s+(?:is\s+)?out,\s*(?P<v>.+?)\s+(?:is\s+)?in$", re.I)
_WILL_USE = re.compile(r"^(?P<s>.+?)\s+will\s+(?:use|get|go\s+with)\s+(?P<v>.+?)\s+(?:for|as)\s+its\s+(?P<a>.+)$", re.I)


def _decision(s: str, ctx: _Context) -> Reading | None:
    match = _WILL_USE.match(s)
    if match:
        reading = _its_attribute(match, ctx, FactType.DECISION, "decision")
        if reading is not None:
            return reading
    for pattern, supersedes in (
        (_IT_IS, False),
        (_THE_CALL, False),
        (_GOES_INSTEAD, True),
        (_OUT_IN, True),
        (_REPLACES, True),
        (_DECIDED, False),
        (_GOING_WITH, False),
        (_SWITCH, True),
        (_SWITCHES, True),
        (_INSTEAD_LAST, True),
        (_INSTEAD, True),
        (_REPLACE, True),
        (_WE_SWITCHED, True),  # after the "from X to Y" shapes
    ):
        match = pattern.match(s)
        if match is None:
            continue
        value = _ALTERNATIVE.sub("", match.group("v"))  # "go with X rather than Y": X
        slot = parse_slot(match.group("np"), ctx.vocabulary) or _tool_slot(match.group("np"), value, ctx.minute)
        if slot is None or not _subject_ok(slot[0], ctx.minute) or not _value_ok(value):
            return None
        return Reading(FactType.DECISION, slot[0], slot[1], value, "decision", supersedes)
    return None


def _tool_slot(purpose: str, tool: str, minute: Minute) -> tuple[str, str] | None:
    """(purpose, "tool") for "we use Sentry for error tracking": a short purpose, a named tool."""
    subject = normalize_subject(purpose)
    words = tool.split()
    if not _subject_ok(subject, minute) or len(subject.split()) > 4 or not 1 <= len(words) <= 4:
        return None
    if words[0].lower() in DETERMINERS or any(ch.isdigit() for ch in words[0]):
        return None
    return subject, "tool"


_USES_AS_ITS = re.compile(
    r"^(?P<s>.+?)\s+(?:uses|runs|is\s+configured\s+with|is\s+set\s+up\s+with)\s+(?P<v>.+?)\s+(?:as|for)\s+"
    r"(?:its|the)\s+(?P<a>.+)$",
    re.I,
)
_IS_ON = re.compile(r"^(?P<s>.+?)\s+is\s+on\s+(?P<v>.+?)\s+for\s+(?:its\s+|the\s+)?(?P<a>.+)$", re.I)
_CHANGE_VERB = r"(?:set|changed|bumped|raised|lowered|increased|reduced|updated)"
_SET_TO = re.compile(rf"^(?:we\s+(?:have\s+)?)?{_CHANGE_VERB}\s+(?P<np>.+?)\s+to\s+(?P<v>.+)$", re.I)
_WAS_SET = re.compile(
    rf"^(?P<np>.+?)\s+(?:(?:was|were|has\s+been|have\s+been|got)\s+{_CHANGE_VERB}|moved|went|changed)\s+to\s+"
    r"(?P<v>.+)$",
    re.I,
)
_DUE = re.compile(
    r"^(?:please\s+get\s+)?(?P<s>.+?)\s+(?:(?:is|are)\s+due|needs\s+to\s+be\s+done|done)\s+(?:on\s+|by\s+)?(?P<d>.+)$",
    re.I,
)
_COPULA = re.compile(
    r"^(?P<np>[^:=]+?)\s+(?P<verb>is\s+now|is\s+still|is\s+currently|is\s+set\s+to|is|are|will\s+be|becomes)\s+"
    r"(?P<v>.+)$",
    re.I,
)
_INVERTED = re.compile(r"^the\s+\S.*\s(?:of|for)\s+\S", re.I)  # "the A of S": only a definite slot phrase inverts
_TERSE = re.compile(r"^(?P<np>[^:=]+?)\s*(?::|=|->|→)\s*(?P<v>.+)$")
# "S A: moving to V (was X)": the value is V, and it replaces X.
_CHANGED_VALUE = re.compile(
    r"^(?:(?:moving|moved|switching|switched|changing|changed|going)\s+to\s+)?(?P<v>.+?)"
    r"(?:\s*\((?:was|previously|formerly|before|from)\s+[^)]*\))?$",
    re.I,
)
_USE_FOR = re.compile(
    r"^(?:we|the\s+team|our\s+team)\s+(?:use|uses|rely\s+on|relies\s+on)\s+(?P<v>.+?)\s+for\s+(?P<p>.+)$", re.I
)
_USING_FOR = re.compile(r"^(?:we're|we\s+are|the\s+team\s+is)\s+using\s+(?P<v>.+?)\s+for\s+(?P<p>.+)$", re.I)
_GOES_THROUGH = re.compile(
    r"^(?:all\s+(?:of\s+)?)?our\s+(?P<p>.+?)\s+(?:goes|go|runs|run)\s+through\s+(?P<v>.+)$", re.I
)
_HAPPENS_IN = re.compile(r"^(?P<p>.+?)\s+(?:happens|is\s+done)\s+in\s+(?P<v>.+)$", re.I)
_WHAT_WE_USE = re.compile(r"^(?P<v>.+?)\s+is\s+what\s+(?:we|the\s+team)\s+uses?\s+for\s+(?P<p>.+)$", re.I)
_WE_DO_WITH = re.compile(r"^(?:we|the\s+team)\s+(?:do|does|handle|handles)\s+(?P<p>.+?)\s+with\s+(?P<v>.+)$", re.I)
_TOOL_FOR_IS = re.compile(r"^(?:the|our)\s+tool\s+for\s+(?P<p>.+?)\s+is\s+(?P<v>.+)$", re.I)
_FOR_WE_USE = re.compile(r"^for\s+(?P<p>[^,]+),?\s+(?:we|the\s+team)\s+(?:use|uses|rely\s+on)\s+(?P<v>.+)$", re.I)


def _its_attribute(match: re.Match[str], ctx: _Context, type_: FactType, rule: str) -> Reading | None:
    """A reading of "S <verb> V as/for its A" (groups s, v, a), or None when A is no attribute or S, V unfit."""
    attribute = normalize_attribute(match.group("a"), ctx.vocabulary)
    subject = normalize_subject(match.group("s"))
    if attribute and _subject_ok(subject, ctx.minute) and _value_ok(match.group("v")):
        return Reading(type_, subject, attribute, match.group("v"), rule)
    return None


def _attribute(s: str, ctx: _Context) -> Reading | None:
    match = _USES_AS_ITS.match(s) or _IS_ON.match(s)
    if match:
        return _its_attribute(match, ctx, FactType.FACT, "attribute")
    for pattern in (_SET_TO, _WAS_SET):
        match = pattern.match(s)
        if match:
            return _slot_reading(match.group("np"), match.group("v"), ctx, "attribute", supersedes=True)
    match = _DUE.match(s)
    if match:
        subject = normalize_subject(match.group("s"))
        day = ground_in_text(match.group("d"), ctx.at)
        if _subject_ok(subject, ctx.minute) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):
            return Reading(FactType.FACT, subject, "deadline", day, "deadline")
        return None
    match = _COPULA.match(s)
    if match:
        verb = match.group("verb").lower()
        if re.match(r"^(?:not|no\s+longer|never)\b", match.group("v"), re.I):
            return None
        reading = _slot_reading(match.group("np"), match.group("v"), ctx, "attribute", supersedes=verb == "is now")
        if reading is None and verb == "is" and _INVERTED.match(match.group("v")):
            # "Postgres is the database of the billing service": the same statement, inverted.
            inverted = parse_slot(match.group("v"), ctx.vocabulary)
            if inverted is not None:
                reading = _checked(inverted, match.group("np"), ctx, "attribute")
        if reading is not None and verb == "will be":
            reading = reading._replace(type=FactType.DECISION)
        if reading is not None:
            return reading
    match = _TERSE.match(s)
    if match:
        reading = _slot_reading(match.group("np"), match.group("v"), ctx, "attribute_terse")
        if reading is not None:
            return reading
    for pattern in (
        _USE_FOR,
        _FOR_WE_USE,
        _USING_FOR,
        _GOES_THROUGH,
        _TOOL_FOR_IS,
        _HAPPENS_IN,
        _WHAT_WE_USE,
        _WE_DO_WITH,
    ):
        match = pattern.match(s)
        if match:
            value = match.group("v")
            slot = parse_slot(match.group("p"), ctx.vocabulary)
            if slot is not None:
                return _checked(slot, value, ctx, "attribute")
            slot = _tool_slot(match.group("p"), value, ctx.minute)
            return _checked(slot, value, ctx, "tool") if slot else None
    return None


def _slot_reading(phrase: str, value: str, ctx: _Context, rule: str, supersedes: bool = False) -> Reading | None:
    slot = parse_slot(phrase, ctx.vocabulary)
    if slot is None:
        return None
    changed = _CHANGED_VALUE.match(value)
    if changed and changed.group("v") != value:
        value, supersedes = changed.group("v"), True
    if slot[1] == "deadline":
        value = ground_in_text(value, ctx.at)
    reading = _checked(slot, value, ctx, "tool" if slot[1] == "tool" else rule)
    return reading._replace(supersedes=supersedes) if reading else None


def _checked(slot: tuple[str, str], value: str, ctx: _Context, rule: str) -> Reading | None:
    subject, attribute = slot
    if not _subject_ok(subject, ctx.minute) or not _value_ok(value):
        return None
    return Reading(FactType.FACT, subject, attribute, value, rule)


_NAME = r"(?P<x>[A-Za-z0-9][\w.\-]*(?:\s+[A-Za-z0-9][\w.\-]*){0,2})"
_AKA = re.compile(
    rf"^{_NAME}(?:\s+is\s+also\s+(?:known\s+as|called)|,\s+also\s+(?:known\s+as|called)|\s+aka|\s+a\.k\.a\.?|"
    r"\s+(?:also\s+)?goes\s+by)\s+(?P<v>.+?)(?:\s+too|\s+as\s+well)?$",
    re.I,
)
_WHAT_THEY_CALL = re.compile(
    rf"^(?P<v>.+?)\s+is\s+what\s+(?:some\s+(?:folks|people)|people|everyone|we|they)\s+(?:also\s+)?calls?\s+{_NAME}$",
    re.I,
)
_IS_A = re.compile(
    rf"^{_NAME}\s+is\s+(?:basically\s+|essentially\s+)?(?:a|an|our|the)\s+(?:name\s+(?:of|for)\s+(?:our|the|a|an)\s+)?(?P<v>.+)$",
    re.I,
)
_FOR_A_WHILE = re.compile(r"\b(?:this|next|last)\s+(?:week|sprint|month|quarter|rotation)\b|\b(?:today|tonight)$", re.I)
# "… we run": who runs it, not what it is.
_WE_KEEP = re.compile(r"\s+(?:that\s+|which\s+)?we\s+(?:run|use|own|operate|maintain|host|have)$", re.I)


def _entity(s: str, ctx: _Context) -> Reading | None:
    patterns = ((_AKA, "alias", "alias"), (_WHAT_THEY_CALL, "alias", "alias"), (_IS_A, "kind", "entity"))
    for pattern, attribute, rule in patterns:
        match = pattern.match(s)
        if match is None:
            continue
        name, value = match.group("x"), _WE_KEEP.sub("", match.group("v"))
        first = name.split(" ", 1)[0].lower()
        subject = normalize_subject(name)
        if first in DETERMINERS or first in PRONOUNS or not _subject_ok(subject, ctx.minute):
            return None
        if value.split(" ", 1)[0].lower() in EVALUATIVE_WORDS or not _value_ok(value, MAX_VALUE_WORDS - 1):
            return None
        if _FOR_A_WHILE.search(value):
            return None  # "reviewer is the on-call this week": a role for a while, not what the name is
        return Reading(FactType.ENTITY, subject, attribute, value, rule)
    return None


# In this order: the first rule that reads a sentence has it.
TEXT_RULES = (_constraint, _decision, _procedure, _preference, _goal, _attribute, _entity)


class Prepared(NamedTuple):
    """A sentence made ready for the rules: its statement, and what its lead words said about it."""

    text: str
    supersedes: bool = False  # "going forward, ...", "from now on, ..."
    valid_from: date | None = None  # "starting tomorrow, ...": the day it holds from
    decision_label: bool = False  # "decision: ...", "we agreed that ..."
    goal_label: bool = False  # "goal: ...": the rest is the goal of the whole tier


def prepare(sentence: str, minute: Minute, at: datetime) -> Prepared | None:
    """`sentence` cleaned for the rules (contractions expanded, the speaker, labels, lead words, attributions and
    dates taken off), or None when there is nothing to read or it asks or hedges."""
    if len(sentence) > MAX_SENTENCE_CHARS:
        return None
    s = _words(_expand(sentence)).rstrip(" .!")
    if minute.agent_id and s.lower().startswith(minute.agent_id.lower() + ":"):
        s = s[len(minute.agent_id) + 1 :].strip()
    if not s or asks_or_hedges(s):
        return None
    decision_label = goal_label = False
    label = _LABEL.match(s)
    while label and label.group("label").lower() in _LABELS:
        name = label.group("label").lower()
        decision_label = decision_label or name in _DECISION_LABELS
        goal_label = goal_label or name in _GOAL_LABELS
        s = label.group("rest")
        label = _LABEL.match(s)
    supersedes = False
    for lead in _CHANGE_LEADS:
        if s.lower().startswith(lead):
            s, supersedes = s[len(lead) :].lstrip(" ,"), True
    s = _CHECKED_LEAD.sub("", s, count=1)
    agreed = _AGREED_THAT.match(s)
    if agreed:
        s, decision_label = agreed.group("rest"), True
    s = _without_attribution(s)
    valid_from = None
    dated = _LEADING_DATE.match(s)
    if dated:
        valid_from, s = day_of(dated.group("d1") or dated.group("d2"), at), dated.group("rest")
    else:
        dated = _TRAILING_DATE.match(s)
        if dated:
            valid_from, s = day_of(dated.group("d"), at), _without_attribution(dated.group("rest"))
    s = _PARENTHETICAL.sub("", s)  # after the dates: "(in force since Monday)" says when
    return Prepared(s, supersedes, valid_from, decision_label, goal_label)


def read(
    sentence: str,
    minute: Minute,
    at: datetime,
    vocabulary: Mapping[str, str] | None = None,
    *,
    prepared: Prepared | None = None,
) -> Reading | None:
    """What `sentence` (one sentence of `minute`, said at `at`) states, or None when it states nothing a rule reads.

    `prepared`: `prepare(sentence, minute, at)` when the caller already has it."""
    prepared = prepared or prepare(sentence, minute, at)
    if prepared is None:
        return None
    ctx = _Context(minute, at, _SURFACES if vocabulary is None else vocabulary, prepared.goal_label)
    for rule in TEXT_RULES:
        reading = rule(prepared.text, ctx)
        if reading is not None:
            break
    else:
        return None
    if prepared.goal_label and reading.type is not FactType.GOAL:
        return None
    return reading._replace(
        supersedes=prepared.supersedes or reading.supersedes,
        valid_from=prepared.valid_from,
        decision_label=prepared.decision_label,
    )


def _without_attribution(s: str) -> str:
    match = _ATTRIBUTION.match(s)
    s = match.group("rest") if match else s
    return _ASIDE.sub("", s)


def sentences(text: str) -> Iterable[str]:
    """The sentences of a note, bullets stripped."""
    for part in _SENTENCES.split(text):
        part = part.strip().lstrip("-*• ").strip()
        if part:
            yield part


def vocabulary(attributes: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Attribute phrase -> canonical name, for `parse_slot` and `read`: from a table shaped like `ATTRIBUTES`."""
    return _surfaces(attributes)
