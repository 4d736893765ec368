"""The one settings object: every environment variable PVM reads, each declared once.

Each field of `Settings` is declared with `setting()`: its variable, its value type (which parses, checks the
range and writes the value back), its default, its help text and whether it is a secret. `Settings.from_env()`,
`Settings.to_env()`, the errors and `settings_reference()` (the docs site's configuration reference) are all
derived from those declarations; nothing parses a variable by hand. Defaults come from `pvm.defaults`.

Standard library on purpose, not pydantic-settings: every agent imports this module (`pip install pvm` is
redis, msgpack and httpx), and pydantic-settings would add 11 MiB of packages with a compiled core (+83% on
the agent's dependencies) and ~75 ms to `import pvm` (~125 ms today), measured for issue 9; comma-separated
lists and the errors' wording would still need code of our own.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Generic, TypeVar, overload
from urllib.parse import urlsplit

from contracts import keys
from contracts.errors import PvmError
from pvm import defaults

T = TypeVar("T")
_DEFINITION = "pvm.setting"  # the key of a field's declaration in its dataclass metadata


class ConfigError(PvmError, ValueError):
    """An environment variable holds a value PVM cannot use."""


class _Refused(Exception):
    """A value type's reason to refuse a raw value: `problem` follows `NAME=value` (or `NAME names item,`)."""

    def __init__(self, problem: str, item: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.item = item


# -- value types -------------------------------------------------------------------------------------------------


class Kind(Generic[T]):
    """How one type of value is read from a variable, checked, written back and described."""

    type_name = "str"
    empty_is_unset = True  # a blank variable means "use the default"; lists read it as "none"

    def parse(self, raw: str) -> T:
        raise NotImplementedError

    def format(self, value: T) -> str:
        return str(value)

    def range(self) -> str:
        """The values it takes, for the reference table ("" for any)."""
        return ""

    def expected(self) -> str:
        """The values it takes, as the fix in an error message."""
        return f"a {self.type_name}"

    def show(self, raw: str) -> str:
        """A raw value as an error message quotes it."""
        return repr(raw)


class Integer(Kind[int]):
    type_name = "int"

    def __init__(self, minimum: int, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def parse(self, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise _Refused("is not a whole number") from None
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise _Refused("is out of range")
        return value

    def range(self) -> str:
        return f">= {self.minimum}" if self.maximum is None else f"{self.minimum} to {self.maximum}"

    def expected(self) -> str:
        if self.maximum is None:
            return f"a whole number >= {self.minimum}"
        return f"a whole number from {self.minimum} to {self.maximum}"


class Number(Kind[float]):
    type_name = "float"

    def __init__(self, minimum: float, maximum: float | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def parse(self, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise _Refused("is not a number") from None
        if not math.isfinite(value):
            raise _Refused("is not a finite number")
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise _Refused("is out of range")
        return value

    def format(self, value: float) -> str:
        return repr(float(value))

    def range(self) -> str:
        return f">= {self.minimum}" if self.maximum is None else f"{self.minimum} to {self.maximum}"

    def expected(self) -> str:
        if self.maximum is None:
            return f"a number >= {self.minimum}"
        return f"a number from {self.minimum} to {self.maximum}"


class Text(Kind[str]):
    def parse(self, raw: str) -> str:
        return raw.strip()


class Url(Kind[str]):
    type_name = "URL"

    def __init__(self, *schemes: str, example: str) -> None:
        self.schemes, self.example = schemes, example

    def parse(self, raw: str) -> str:
        value = raw.strip()
        parts = urlsplit(value)
        if parts.scheme not in self.schemes or not (parts.netloc or parts.path):
            raise _Refused(f"is not a URL starting {self._schemes()}")
        return value

    def range(self) -> str:
        return ", ".join(f"`{s}://`" for s in self.schemes)

    def expected(self) -> str:
        return f"a URL starting {self._schemes()} (e.g. {self.example})"

    def show(self, raw: str) -> str:
        parts = urlsplit(raw.strip())
        if parts.password:  # never print a password
            return repr(raw.replace(f":{parts.password}@", ":***@", 1))
        return repr(raw)

    def _schemes(self) -> str:
        names = [f"{s}://" for s in self.schemes]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class FilePath(Kind[Path]):
    type_name = "path"

    def parse(self, raw: str) -> Path:
        return Path(raw.strip())


class Names(Kind[tuple[str, ...]]):
    """A comma-separated list of names, each one `accepts()` takes; an empty variable is the empty list."""

    type_name = "list"
    empty_is_unset = False
    refusal = "is not a name"

    def accepts(self, name: str) -> bool:
        raise NotImplementedError

    def parse(self, raw: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in raw.split(",") if n.strip())
        for name in names:
            if not self.accepts(name):
                raise _Refused(self.refusal, item=name)
        return names

    def format(self, value: tuple[str, ...]) -> str:
        return ",".join(value)


class Pools(Names):
    """Pools the log pool fans batches out to: any pool of `contracts.keys.POOL_JOBS` but the log itself."""

    refusal = "is not a pool the log feeds"

    def accepts(self, name: str) -> bool:
        return name in self._choices()

    def range(self) -> str:
        return f"comma-separated, from: {self._choices()}; empty: none"

    def expected(self) -> str:
        return f"pools the log feeds, comma-separated, from: {self._choices()} (empty for none)"

    @staticmethod
    def _choices() -> str:
        return ", ".join(sorted(pool for pool in keys.POOL_JOBS if pool != "log")) or "none yet"


class ThreadSources(Names):
    """What names a minute's thread, in the order it is looked for: `thread`, `task`, `project`, each at most once."""

    refusal = "is not one of thread, task, project"
    empty_is_unset = True  # no thread at all would switch the pool off: PVM_DOWNSTREAM does that

    def accepts(self, name: str) -> bool:
        return name in defaults.THREAD_BY

    def parse(self, raw: str) -> tuple[str, ...]:
        names = super().parse(raw)
        if not names or len(set(names)) != len(names):
            raise _Refused("must name some of thread, task, project, each once")
        return names

    def range(self) -> str:
        return "comma-separated, from: thread, task, project (first found first)"

    def expected(self) -> str:
        return "some of thread, task, project, comma-separated, each once (e.g. thread,task,project)"


class Choice(Kind[str]):
    """One of a few words."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices

    def parse(self, raw: str) -> str:
        value = raw.strip().lower()
        if value not in self.choices:
            raise _Refused("is not one of " + ", ".join(self.choices))
        return value

    def range(self) -> str:
        return ", ".join(self.choices)

    def expected(self) -> str:
        return "one of " + ", ".join(self.choices)


class DottedNames(Names):
    """Exact dotted names of functions (package.module.function)."""

    refusal = "is not a dotted function name"
    _DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")

    def accepts(self, name: str) -> bool:
        return self._DOTTED.fullmatch(name) is not None

    def range(self) -> str:
        return "comma-separated dotted names, like `package.module.function`"

    def expected(self) -> str:
        return "exact dotted names like package.module.function, comma-separated"


class Weights(Kind[tuple[float, float, float, float]]):
    """The ranking's four weights, `semantic,keyword,recency,importance`."""

    type_name = "4 floats"
    legs = "semantic,keyword,recency,importance"

    def parse(self, raw: str) -> tuple[float, float, float, float]:
        try:
            parts = [float(p) for p in raw.split(",")]
        except ValueError:
            raise _Refused("holds something that is not a number") from None
        if len(parts) != 4:
            raise _Refused(f"has {len(parts)} numbers, not 4")
        if not all(math.isfinite(p) and p >= 0 for p in parts) or not sum(parts):
            raise _Refused("is out of range")
        return parts[0], parts[1], parts[2], parts[3]

    def format(self, value: tuple[float, float, float, float]) -> str:
        return ",".join(repr(float(w)) for w in value)

    def range(self) -> str:
        return f"`{self.legs}`, each >= 0, not all 0"

    def expected(self) -> str:
        return f"four comma-separated numbers ({self.legs}), each >= 0 and not all 0"


class ScoreWeights(Weights):
    """The evaluate pool's composite weights, `recency,relevance,accuracy,impact` (the composite is their mean)."""

    legs = "recency,relevance,accuracy,impact"


class TierSplit(Kind[tuple[float, float, float]]):
    """How the facts of a context share its facts budget: `task,project,global` weights."""

    type_name = "3 numbers"
    tiers = "task,project,global"

    def parse(self, raw: str) -> tuple[float, float, float]:
        try:
            parts = [float(p) for p in raw.split(",")]
        except ValueError:
            raise _Refused("holds something that is not a number") from None
        if len(parts) != 3:
            raise _Refused(f"has {len(parts)} numbers, not 3")
        if not all(math.isfinite(p) and p >= 0 for p in parts) or not sum(parts):
            raise _Refused("is out of range")
        return parts[0], parts[1], parts[2]

    def format(self, value: tuple[float, float, float]) -> str:
        return ",".join(str(int(w)) if float(w).is_integer() and abs(w) < 1e15 else repr(float(w)) for w in value)

    def range(self) -> str:
        return f"`{self.tiers}`, each >= 0, not all 0 (shares of the whole)"

    def expected(self) -> str:
        return f"three comma-separated numbers ({self.tiers}), each >= 0 and not all 0, such as 40,40,20"


# -- declarations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One variable's declaration: the single source of its parsing, default, range, help and secrecy."""

    env: str
    kind: Kind[Any]
    default: Any
    help: str
    unset: str = ""  # what an unset variable means, where the default is None
    secret: bool = False  # kept out of repr() and error messages
    under_home: bool = False  # the default is a path under PVM_HOME
    field: str = ""  # the Settings attribute (filled in from the dataclass)

    def read(self, raw: str) -> Any:
        """The value `raw` stands for, or a ConfigError naming the variable and the fix."""
        try:
            return self.kind.parse(raw)
        except _Refused as refused:
            shown = "<hidden>" if self.secret else self.kind.show(raw)
            what = f"{self.env}={shown}" if refused.item is None else f"{self.env} names {refused.item!r}, which"
            raise ConfigError(
                f"{what} {refused.problem}: set {self.kind.expected()}, or {self._when_unset()}"
            ) from None

    def _when_unset(self) -> str:
        if self.default is None:
            return f"unset it for {self.unset}" if self.unset else "unset it"
        default = self.default_text()
        return "unset it for none" if default == "(unset)" else f"unset it for the default ({default})"

    def default_text(self) -> str:
        if self.under_home:
            return f"$PVM_HOME/{self.default}"
        if self.default is None:
            return f"(unset: {self.unset})" if self.unset else "(unset)"
        return self.kind.format(self.default) or "(unset)"

    def reference(self) -> dict[str, str]:
        return {
            "env": self.env,
            "default": self.default_text(),
            "type": f"{self.kind.type_name}, secret" if self.secret else self.kind.type_name,
            "range": self.kind.range(),
            "help": self.help,
        }


@overload
def setting(
    env: str, kind: Kind[T], default: T, help: str, *, unset: str = "", secret: bool = False, under_home: bool = False
) -> T: ...
@overload
def setting(
    env: str,
    kind: Kind[T],
    default: None,
    help: str,
    *,
    unset: str = "",
    secret: bool = False,
    under_home: bool = False,
) -> T | None: ...
def setting(
    env: str,
    kind: Kind[Any],
    default: Any,
    help: str,
    *,
    unset: str = "",
    secret: bool = False,
    under_home: bool = False,
) -> Any:
    """Declare a Settings field read from the variable `env`."""
    declaration = Setting(env, kind, default, help, unset, secret, under_home)
    return field(default=default, repr=not secret, metadata={_DEFINITION: declaration})


def _weights_text(weights: tuple[float, ...]) -> str:
    return ",".join(f"{w:g}" for w in weights)


@dataclass(frozen=True)
class Settings:
    """Runtime configuration shared by the library, the workers and the CLI.

    `from_env()` checks each value against its declaration; a Settings built in code is taken as given.
    """

    redis_url: str | None = setting(
        "PVM_REDIS_URL",
        Url("redis", "rediss", "unix", example=defaults.REDIS_URL_EXAMPLE),
        None,
        "Redis or Valkey server (Redis >= 7); a password goes in the URL",
        unset="embedded Valkey",
    )
    shards: int = setting(
        "PVM_SHARDS", Integer(minimum=1), defaults.SHARDS, "minute streams; every producer and dispatcher must agree"
    )
    home: Path = setting(
        "PVM_HOME",
        FilePath(),
        Path("."),
        "base directory of `var/`: log, spool, embedded Valkey data, embedded vector engine",
    )
    log_dir: Path = setting(
        "PVM_LOG_DIR", FilePath(), Path(defaults.LOG_DIR), "the durable log's directory", under_home=True
    )
    spool_dir: Path = setting(
        "PVM_SPOOL_DIR",
        FilePath(),
        Path(defaults.SPOOL_DIR),
        "where an emitter spools minutes while Redis is unreachable; give long-running agents a fixed one",
        under_home=True,
    )
    downstream: tuple[str, ...] = setting(
        "PVM_DOWNSTREAM",
        Pools(),
        defaults.DOWNSTREAM,
        "pools the log pool fans each durable batch out to (empty: none)",
    )
    recent_window: int = setting(
        "PVM_RECENT_WINDOW",
        Integer(minimum=1),
        defaults.RECENT_WINDOW,
        "newest minutes per project (and per agent) cached in Redis",
    )
    minute_cache_size: int = setting(
        "PVM_MINUTE_CACHE_SIZE",
        Integer(minimum=1),
        defaults.MINUTE_CACHE_SIZE,
        "minutes per project cached by id in Redis",
    )
    dispatch_batch: int = setting(
        "PVM_DISPATCH_BATCH", Integer(minimum=1), defaults.DISPATCH_BATCH_SIZE, "minutes per log-pool job"
    )
    fanout_batch: int = setting(
        "PVM_FANOUT_BATCH",
        Integer(minimum=1),
        defaults.FANOUT_BATCH_SIZE,
        "minutes per downstream job: the log pool cuts each durable batch's fan-out into jobs of at most this many",
    )
    claim_idle_ms: int = setting(
        "PVM_CLAIM_IDLE_MS",
        Integer(minimum=1),
        defaults.DISPATCH_CLAIM_IDLE_MS,
        "milliseconds an entry stays pending with a silent dispatcher before another one reclaims it",
    )
    max_deliveries: int = setting(
        "PVM_MAX_DELIVERIES",
        Integer(minimum=1),
        defaults.DISPATCH_MAX_DELIVERIES,
        "deliveries of a stream entry before it goes to the dead-letter stream",
    )
    job_timeout: int = setting(
        "PVM_JOB_TIMEOUT",
        Integer(minimum=1),
        defaults.JOB_TIMEOUT_S,
        f"seconds a log-pool job may run (jobs of the pools it feeds: {defaults.DOWNSTREAM_JOB_TIMEOUT_S}, "
        "`DOWNSTREAM_JOB_TIMEOUT_S` in `pvm/defaults.py`)",
    )
    qdrant_url: str | None = setting(
        "PVM_QDRANT_URL",
        Url("http", "https", example=defaults.QDRANT_URL_EXAMPLE),
        None,
        f"Qdrant server; unset, the in-process engine keeps its shards in `$PVM_HOME/{defaults.VECTOR_DIR}`",
        unset="embedded engine",
    )
    qdrant_api_key: str | None = setting(
        "PVM_QDRANT_API_KEY", Text(), None, "API key for `PVM_QDRANT_URL`", secret=True
    )
    embed_model: str | None = setting(
        "PVM_EMBED_MODEL",
        Text(),
        None,
        "embedding model the endpoint serves; setting it turns on dense vectors",
        unset="lexical vectors only",
    )
    openai_base_url: str | None = setting(
        "OPENAI_BASE_URL",
        Url("http", "https", example=defaults.OPENAI_DEFAULT_BASE_URL),
        None,
        "any OpenAI-compatible endpoint for embeddings, and for the LLM unless `PVM_LLM_BASE_URL` is set",
        unset=defaults.OPENAI_DEFAULT_BASE_URL,
    )
    openai_api_key: str | None = setting(
        "OPENAI_API_KEY", Text(), None, "key for `OPENAI_BASE_URL` (required by api.openai.com)", secret=True
    )
    embed_dimensions: int | None = setting(
        "PVM_EMBED_DIMENSIONS",
        Integer(minimum=1),
        None,
        "dense vector length to request; must match what the vector store holds",
        unset="the model's",
    )
    embed_batch_size: int = setting(
        "PVM_EMBED_BATCH_SIZE",
        Integer(minimum=1, maximum=defaults.EMBED_BATCH_SIZE_MAX),
        defaults.EMBED_BATCH_SIZE,
        f"inputs per embedding request (at most {defaults.EMBED_BATCH_SIZE_MAX}, OpenAI's limit)",
    )
    embed_max_retries: int = setting(
        "PVM_EMBED_MAX_RETRIES",
        Integer(minimum=0),
        defaults.EMBED_MAX_RETRIES,
        "retries of 429s, 5xx answers and timeouts before an embedding batch fails",
    )
    embed_timeout_s: float = setting(
        "PVM_EMBED_TIMEOUT", Number(minimum=0.1), defaults.EMBED_TIMEOUT_S, "seconds per embedding request"
    )
    embed_query_timeout_s: float = setting(
        "PVM_EMBED_QUERY_TIMEOUT",
        Number(minimum=0.05),
        defaults.EMBED_QUERY_TIMEOUT_S,
        "seconds a search waits for its query's embedding (one try) before it answers lexical-only",
    )
    search_weights: tuple[float, float, float, float] | None = setting(
        "PVM_SEARCH_WEIGHTS",
        Weights(),
        None,
        "weights of the ranking's legs: semantic, keyword, recency, importance",
        unset=f"{_weights_text(defaults.SEARCH_WEIGHTS)}; "
        f"{_weights_text(defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)} with PVM_EMBED_MODEL",
    )
    api_url: str | None = setting(
        "PVM_API_URL",
        Url("http", "https", example=defaults.API_URL),
        None,
        "the reader API that `pvm context`, `pvm search` and the HTTP client call",
        unset=defaults.API_URL,
    )
    api_token: str | None = setting(
        "PVM_API_TOKEN",
        Text(),
        None,
        "bearer token the reader API requires on every route but /healthz; clients send it",
        unset="no auth",
        secret=True,
    )
    api_tokens_file: Path | None = setting(
        "PVM_API_TOKENS_FILE",
        FilePath(),
        None,
        "JSON file of project-scoped token hashes for the reader API (`pvm token new`); re-read on change",
    )
    search_hot_minutes: int = setting(
        "PVM_SEARCH_HOT_MINUTES",
        Integer(minimum=0),
        defaults.SEARCH_HOT_MINUTES,
        "the embedded engine's hot window: of a project past 8N minutes, its newest N to 2N, which its "
        "searches read first (0: none)",
    )
    optimize_every_s: int = setting(
        "PVM_OPTIMIZE_EVERY",
        Integer(minimum=0),
        defaults.OPTIMIZE_EVERY_S,
        "seconds between the scheduler's optimize runs of the embedded engine (0: never)",
    )
    extra_job_functions: tuple[str, ...] = setting(
        "PVM_EXTRA_JOB_FUNCTIONS",
        DottedNames(),
        (),
        "job functions workers run besides PVM's own",
    )
    llm_model: str | None = setting(
        "PVM_LLM_MODEL",
        Text(),
        None,
        "chat model of an OpenAI-compatible endpoint for fact extraction, summaries and judging; "
        "setting it turns the LLM on",
        unset="no LLM: rule-based extraction, extractive summaries",
    )
    llm_base_url: str | None = setting(
        "PVM_LLM_BASE_URL",
        Url("http", "https", example=defaults.OPENAI_DEFAULT_BASE_URL),
        None,
        "the LLM's OpenAI-compatible endpoint, when it is not `OPENAI_BASE_URL`",
        unset="`OPENAI_BASE_URL`",
    )
    llm_api_key: str | None = setting(
        "PVM_LLM_API_KEY",
        Text(),
        None,
        "key for the LLM's endpoint, when it is not `OPENAI_API_KEY`",
        unset="`OPENAI_API_KEY`",
        secret=True,
    )
    llm_timeout_s: float = setting(
        "PVM_LLM_TIMEOUT", Number(minimum=0.1), defaults.LLM_TIMEOUT_S, "seconds per LLM request"
    )
    llm_max_retries: int = setting(
        "PVM_LLM_MAX_RETRIES",
        Integer(minimum=0),
        defaults.LLM_MAX_RETRIES,
        "retries of 429s, 5xx answers, timeouts and connection errors before an LLM call fails",
    )
    llm_max_tokens: int = setting(
        "PVM_LLM_MAX_TOKENS",
        Integer(minimum=1),
        defaults.LLM_MAX_TOKENS,
        "completion tokens one LLM answer may use",
    )
    llm_temperature: float = setting(
        "PVM_LLM_TEMPERATURE",
        Number(minimum=0.0, maximum=2.0),
        defaults.LLM_TEMPERATURE,
        "sampling temperature of LLM calls (0: the same answer every time)",
    )
    fact_promote_at: float = setting(
        "PVM_FACT_PROMOTE_AT",
        Number(minimum=0.0, maximum=1.0),
        defaults.FACT_PROMOTE_AT,
        "confidence at which the facts pool promotes an extracted fact to current knowledge (below: pending); "
        f"{defaults.FACT_PROMOTE_AT} chosen on the calibration wording of the labeled set (docs/extraction.md)",
    )
    fact_statements: str = setting(
        "PVM_FACT_STATEMENTS",
        Choice("keep", "off"),
        defaults.FACT_STATEMENTS,
        "keep: a minute the rules read no fact from keeps what its speaker says of themselves that lasts, as "
        "said (docs/extraction.md, statements); off: such minutes state nothing",
    )
    fact_tier_split: tuple[float, float, float] = setting(
        "PVM_FACT_TIER_SPLIT",
        TierSplit(),
        defaults.FACT_TIER_SPLIT,
        "how a context's facts section splits its tokens across the task, project and global tiers (weights); "
        "a tier not read, or needing less, leaves its share to the others",
    )
    thread_by: tuple[str, ...] = setting(
        "PVM_THREAD_BY",
        ThreadSources(),
        defaults.THREAD_BY,
        "what names a minute's thread for the summarize pool, first found first: its `thread_id`, its task "
        "(`data.task_id`), its project",
    )
    summarizer: str = setting(
        "PVM_SUMMARIZER",
        Choice("extractive", "llm"),
        defaults.SUMMARIZER,
        "how the summarize pool summarizes a chunk: extractive (offline, deterministic) or llm (PVM_LLM_MODEL; "
        "extractive where a call fails)",
    )
    summary_recent: int = setting(
        "PVM_SUMMARY_RECENT", Integer(minimum=1), defaults.SUMMARY_RECENT, "a thread's newest minutes kept verbatim"
    )
    summary_chunk: int = setting(
        "PVM_SUMMARY_CHUNK", Integer(minimum=1, maximum=100), defaults.SUMMARY_CHUNK, "minutes per chunk of a thread"
    )
    summary_max_chunks: int = setting(
        "PVM_SUMMARY_MAX_CHUNKS",
        Integer(minimum=2),
        defaults.SUMMARY_MAX_CHUNKS,
        "chunks a thread keeps; past it the two oldest merge into one",
    )
    summary_ratio: float = setting(
        "PVM_SUMMARY_RATIO",
        Number(minimum=0.01, maximum=1.0),
        defaults.SUMMARY_RATIO,
        "share of its chunk's tokens an extractive summary aims at (decisions are kept beyond it)",
    )
    context_recent_share: float = setting(
        "PVM_CONTEXT_RECENT_SHARE",
        Number(minimum=0.0, maximum=1.0),
        defaults.CONTEXT_RECENT_SHARE,
        "share of a thread's context budget its newest minutes may use",
    )
    context_retrieved_share: float = setting(
        "PVM_CONTEXT_RETRIEVED_SHARE",
        Number(minimum=0.0, maximum=1.0),
        defaults.CONTEXT_RETRIEVED_SHARE,
        "share of a thread's context budget its chunk summaries and episodes may use, besides what the newest "
        "minutes leave",
    )
    # -- PAIR loop (area: pair; docs/pair.md) --
    pair_target: int = setting(
        "PVM_PAIR_TARGET",
        Integer(minimum=1, maximum=100),
        defaults.PAIR_TARGET,
        "score (0-100) at which a PAIR run stops revising",
    )
    pair_rounds: int = setting(
        "PVM_PAIR_ROUNDS",
        Integer(minimum=1, maximum=20),
        defaults.PAIR_ROUNDS,
        "judgments a PAIR run makes at most (and one revision fewer)",
    )
    pair_k: int = setting(
        "PVM_PAIR_K",
        Integer(minimum=1, maximum=defaults.PAIR_MAX_K),
        defaults.PAIR_K,
        "memories (minutes and facts) a PAIR run retrieves for each gap",
    )
    pair_judge: str = setting(
        "PVM_PAIR_JUDGE",
        Choice("checklist", "llm"),
        defaults.PAIR_JUDGE,
        "who judges a PAIR round: checklist (criteria read as checks; offline, deterministic) or llm "
        "(PVM_LLM_MODEL; the checklist judges a round the model fails)",
    )
    pair_reviser: str = setting(
        "PVM_PAIR_REVISER",
        Choice("extractive", "llm"),
        defaults.PAIR_REVISER,
        "who revises a PAIR output: extractive (quotes the retrieved memories that fill each gap, cited by id) or "
        "llm (PVM_LLM_MODEL; extractive for a round the model fails)",
    )
    redis_start_wait_s: float = setting(
        "PVM_REDIS_START_WAIT",
        Number(minimum=0),
        defaults.REDIS_START_WAIT_S,
        "seconds a long-running command (`up`, `dispatch`, `worker`, `scheduler`, `exporter`, `serve`) waits at "
        "start for Redis before it gives up (0: not at all)",
    )

    # -- evaluate pool (area: evaluate pool; docs/lifecycle.md) --
    evaluate_every_s: int = setting(
        "PVM_EVALUATE_EVERY",
        Integer(minimum=0),
        defaults.EVALUATE_EVERY_S,
        "seconds between the scheduler's evaluation runs (score, dedupe, prune every project; 0: never)",
    )
    evaluate_slice: int = setting(
        "PVM_EVALUATE_SLICE",
        Integer(minimum=1),
        defaults.EVALUATE_SLICE,
        "log minutes (or facts) one evaluation job handles: a run is one job per slice, never one per project",
    )
    score_weights: tuple[float, float, float, float] = setting(
        "PVM_SCORE_WEIGHTS",
        ScoreWeights(),
        defaults.SCORE_WEIGHTS,
        "weights of a memory's composite score: recency, relevance, accuracy, impact (weighted mean)",
    )
    prune_below: float = setting(
        "PVM_PRUNE_BELOW",
        Number(minimum=0.0, maximum=1.0),
        defaults.PRUNE_BELOW,
        "a memory whose composite (a fact: importance x decay) is below this, and older than PVM_PRUNE_GRACE, "
        "leaves the vector store and hot caches (never the log; `pvm replay` restores it); 0: never prune",
    )
    prune_grace_s: int = setting(
        "PVM_PRUNE_GRACE",
        Integer(minimum=0),
        defaults.PRUNE_GRACE_S,
        "seconds a memory is kept whatever its score (its age: since its timestamp, a fact's since recorded)",
    )
    dedupe_at: float = setting(
        "PVM_DEDUPE_AT",
        Number(minimum=0.0, maximum=1.0),
        defaults.DEDUPE_AT,
        "word overlap (Jaccard) at which two minutes of one task and event type are near-duplicates and merge "
        "into the better scored one; 1: only identical notes; measured in docs/lifecycle.md",
    )
    fact_dedupe_at: float = setting(
        "PVM_FACT_DEDUPE_AT",
        Number(minimum=0.0, maximum=1.0),
        defaults.FACT_DEDUPE_AT,
        "word overlap (Jaccard) at which two current facts of one tier key, type and slot (or one value and near "
        "subjects) are near-duplicates and merge into the better scored one; different values never merge; "
        "measured in docs/lifecycle.md",
    )

    @property
    def vector_dir(self) -> Path:
        """Where the embedded vector engine keeps its shards."""
        return Path(self.home) / defaults.VECTOR_DIR

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from `env` (default: the process environment); ConfigError on a value PVM cannot use."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for definition in DEFINITIONS:
            raw = env.get(definition.env)
            if raw is not None and (raw.strip() or not definition.kind.empty_is_unset):
                values[definition.field] = definition.read(raw)
        home = values.get("home", cls.home)
        for definition in DEFINITIONS:
            if definition.under_home and definition.field not in values:
                values[definition.field] = home / definition.default
        return cls(**values)

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce these settings in a child process (secrets included)."""
        env = {}
        for definition in DEFINITIONS:
            value = getattr(self, definition.field)
            if value is not None:
                env[definition.env] = definition.kind.format(value)
        return env


DEFINITIONS: tuple[Setting, ...] = tuple(replace(f.metadata[_DEFINITION], field=f.name) for f in fields(Settings))


def settings_reference() -> list[dict[str, str]]:
    """Every variable PVM reads, in declaration order: env, default, type, range and help (the docs' reference)."""
    return [definition.reference() for definition in DEFINITIONS]
