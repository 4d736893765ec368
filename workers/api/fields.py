"""Typed specs of the reader API's request fields: what the routes parse through and the OpenAPI document shows.

A `Field` is one query or path parameter or one JSON body field: its name, where it travels, whether it is
required, what it holds (a `Value`: the JSON type and its limits, taken from the contract's constants) and
what it means. A `Body` is a route's JSON object body: its fields, in the order the refusals list them. A
route reads its parameters through its fields (`Field.integer`, `Field.choices`, `Field.text`) and its body
through its `Body.parse`, and workers/api/openapi.py renders the same objects (`Field.parameter`,
`Body.request_body`), so a limit, an enum or a required field is written once.

The facts, memory and PAIR routes declare their fields in their own modules; the reads workers/api/app.py
serves (context, search, recent, threads, minutes by id) have no module of their own, so theirs are here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request

from contracts.facts import MAX_TASK_ID_LENGTH
from contracts.minute import MAX_NAME_LENGTH
from pvm import defaults
from pvm.search import KINDS, PREFERENCES
from workers.api.request import choices_param, int_param, json_object, list_param

JSON = "application/json"
# Where the document's components live, as a JSON pointer prefix for `$ref`.
COMPONENTS = "#/components/schemas/"
# Whitespace as Python reads it, for a regex character class: str.isspace also takes \x1c-\x1f and \x85, which
# JSON Schema's \s does not. The contract refuses a blank name or text by `isspace`, so the document says the same:
# NON_BLANK is one character that is not whitespace.
BLANK = r"\s\x1c-\x1f\x85"
NON_BLANK = f"[^{BLANK}]"

Where = Literal["query", "path", "body"]
JsonType = Literal["string", "integer", "number", "boolean", "array", "object"]


def ref(name: str) -> dict[str, str]:
    """A `$ref` to the document's component `name`."""
    return {"$ref": COMPONENTS + name}


@dataclass(frozen=True)
class Value:
    """What a field holds, as JSON Schema: a type and its limits, or a component (`ref`), or one of several."""

    type: JsonType | None = None  # None: the value is told by `enum`, `ref` or `one_of` alone
    minimum: int | float | None = None
    maximum: int | float | None = None
    default: int | float | str | None = None  # the value a left-out field stands for (documented)
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    enum: tuple[str, ...] = ()
    items: Value | None = None  # an array's
    min_items: int | None = None
    max_items: int | None = None
    values: Value | None = None  # an object's: every property's value (additionalProperties)
    ref: str | None = None  # a component of the document (MinuteId, FactTime)
    one_of: tuple[Value, ...] = ()
    description: str = ""
    example: str | None = None

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the value."""
        if self.ref is not None:
            return ref(self.ref)
        schema: dict[str, Any] = {}
        if self.one_of:
            schema["oneOf"] = [v.schema() for v in self.one_of]
        if self.type is not None:
            schema["type"] = self.type
        if self.enum:
            schema["enum"] = list(self.enum)
        constraints = {
            "minimum": self.minimum,
            "maximum": self.maximum,
            "minLength": self.min_length,
            "maxLength": self.max_length,
            "pattern": self.pattern,
            "minItems": self.min_items,
            "maxItems": self.max_items,
            "default": self.default,
        }
        schema.update({key: value for key, value in constraints.items() if value is not None})
        if self.items is not None:
            schema["items"] = self.items.schema()
        if self.values is not None:
            schema["additionalProperties"] = self.values.schema()
        if self.description:
            schema["description"] = self.description
        if self.example is not None:
            schema["example"] = self.example
        return schema


def integer(low: int, high: int, default: int | None = None) -> Value:
    """A whole number from `low` to `high`."""
    return Value("integer", minimum=low, maximum=high, default=default)


def choices(allowed: tuple[str, ...]) -> Value:
    """A list of values each one of `allowed`: in a query, repeated, comma-separated, or both."""
    return Value("array", items=Value(enum=allowed))


STRING = Value("string")
BOOLEAN = Value("boolean")
# A list in a query: repeated, comma-separated, or both; empty entries are ignored (`list_param`).
STRINGS = Value("array", items=STRING)
# A task id as the contract takes it (`contracts.facts.check_task_id`): non-blank text, at most MAX_TASK_ID_LENGTH.
TASK_ID = Value("string", min_length=1, max_length=MAX_TASK_ID_LENGTH, pattern=NON_BLANK, description="a task id")
# An agent id as a minute carries it (contracts.minute: at most MAX_NAME_LENGTH).
AGENT_ID = Value("string", max_length=MAX_NAME_LENGTH)


@dataclass(frozen=True)
class Field:
    """One field of a request: a query or path parameter, or a property of the JSON body."""

    name: str
    where: Where
    value: Value
    description: str = ""  # for a parameter, the parameter's; for a body field, its schema's (else the value's)
    required: bool = False
    example: str | None = None  # a required parameter's (the document shows one)

    # -- the document ---------------------------------------------------------------------------------------

    def parameter(self) -> dict[str, Any]:
        """The OpenAPI parameter object of a query or path parameter."""
        if self.where == "body":
            raise ValueError(f"{self.name} is a body field, not a parameter")
        parameter: dict[str, Any] = {"name": self.name, "in": self.where, "required": self.required}
        parameter["schema"] = self.value.schema()
        parameter["description"] = self.description
        if self.example is not None:
            parameter["example"] = self.example
        return parameter

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of a body field: its value's, with the field's description."""
        schema = self.value.schema()
        if not self.description:
            return schema
        if "$ref" in schema:  # a component keeps its own words; the field's sit beside it
            schema = {"allOf": [schema]}
        return {**schema, "description": self.description}

    # -- reading a parameter --------------------------------------------------------------------------------

    def raw(self, request: Request) -> str | None:
        """The parameter as sent, or None when it was left out."""
        found = (request.path_params if self.where == "path" else request.query_params).get(self.name)
        return None if found is None else str(found)

    def text(self, request: Request) -> str | None:
        """The parameter as sent; None when left out or sent empty (an empty one reads as left out)."""
        return self.raw(request) or None

    def integer(self, request: Request, default: int | None = None) -> int:
        """A whole-number query parameter within the value's bounds; `default` (else the value's) when left out."""
        low, high, documented = self.value.minimum, self.value.maximum, self.value.default
        fallback = documented if default is None else default
        if not (isinstance(low, int) and isinstance(high, int) and isinstance(fallback, int)):
            raise TypeError(f"query parameter {self.name}: an integer field needs whole bounds and a default")
        return int_param(request, self.name, fallback, low, high)

    def choices(self, request: Request) -> tuple[str, ...]:
        """A list query parameter whose every entry is one of the value's items (each once, in the order sent)."""
        if self.value.items is None or not self.value.items.enum:
            raise TypeError(f"query parameter {self.name}: a choices field needs a list of values")
        return choices_param(request, self.name, self.value.items.enum)

    def strings(self, request: Request) -> tuple[str, ...]:
        """A list query parameter: repeated, comma-separated, or both; empty entries are ignored."""
        return list_param(request, self.name)


def query_param(name: str, value: Value, description: str, example: str | None = None) -> Field:
    """A query parameter: optional, or required with an example value."""
    return Field(name, "query", value, description, required=example is not None, example=example)


def path_param(name: str, value: Value, description: str, example: str) -> Field:
    """A path parameter (always required)."""
    return Field(name, "path", value, description, required=True, example=example)


def body_field(name: str, value: Value, description: str = "", required: bool = False) -> Field:
    """A field of a JSON object body."""
    return Field(name, "body", value, description, required=required)


@dataclass(frozen=True)
class Body:
    """A route's JSON object body: its fields (the required ones first), and what it is."""

    fields: tuple[Field, ...]
    description: str
    required: bool = True  # False: the body may be left out (an empty body is `{}`)

    def __post_init__(self) -> None:
        # The refusals list the fields required ones first (`json_object`); so does the document.
        flags = [f.required for f in self.fields]
        if flags != sorted(flags, reverse=True):
            raise ValueError("a body lists its required fields first")
        if any(f.where != "body" for f in self.fields):
            raise ValueError("a body holds body fields")

    @property
    def required_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    @property
    def optional_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if not f.required)

    def field(self, name: str) -> Field:
        """The field called `name`."""
        return next(f for f in self.fields if f.name == name)

    def parse(self, raw: bytes) -> dict[str, Any]:
        """The body: a JSON object with every required field and no other than this body's (else 400 / 422)."""
        return json_object(raw, self.required_names, self.optional_names)

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the body: exactly these fields."""
        return {
            "type": "object",
            "properties": {f.name: f.schema() for f in self.fields},
            "required": list(self.required_names),
            "additionalProperties": False,
        }

    def request_body(self) -> dict[str, Any]:
        """The OpenAPI request body object."""
        return {
            "required": self.required,
            "description": self.description,
            "content": {JSON: {"schema": self.schema()}},
        }


# -- the reads of workers/api/app.py ------------------------------------------------------------------------------
# app.py parses these parameters with the same bounds (`int_param(request, "k", defaults.SEARCH_K, 1, 100)`);
# reading them through these fields instead (`SEARCH_K.integer(request)`) leaves each bound written here only.

# Unix ms up to 2**53: every time a JSON number holds exactly.
TIME_MS = integer(0, 2**53)
CONTEXT_BUDGET_MAX = 1_000_000  # tokens a context may be asked for
SEARCH_K_MAX = 100  # hits one search answers at most
RECENT_MAX = 1_000  # minutes one recent (or thread) read answers at most
RECENT_DEFAULT = 50

BUDGET_TOKENS = query_param(
    "budget_tokens", integer(1, CONTEXT_BUDGET_MAX, defaults.CONTEXT_BUDGET_TOKENS), "the token budget"
)
CONTEXT_PARAMS = (
    query_param("agent_id", Value("string", min_length=1), "the agent the context is for", "coder"),
    query_param("task", STRING, "the task at hand: finds relevant past experience and the rules it matches"),
    # app.py checks it as the contract's task id (`check_task_id`): 400 for a blank or too long one.
    query_param("task_id", TASK_ID, "the task's id: its task-tier facts join the project's"),
    query_param("tag", STRINGS, "the task's tags, which rules match too (repeat, or comma-separate)"),
    BUDGET_TOKENS,
    query_param("format", STRING, "text: the prompt-ready text (any other value: the JSON package)"),
    query_param(
        "thread",
        STRING,
        "build the context for one thread (a thread id, task:<task id> or project): its newest minutes, "
        "then its chunk summaries and episodes (400 for a name that names no thread)",
    ),
)
SEARCH_K = query_param("k", integer(1, SEARCH_K_MAX, defaults.SEARCH_K), "how many hits")
SINCE_MS = query_param("since_ms", TIME_MS, "minutes at or after this time (Unix ms; 0: no bound)")
UNTIL_MS = query_param("until_ms", TIME_MS, "minutes before this time (Unix ms; 0: no bound)")
MIN_COMPOSITE = query_param("min_composite", Value("number", minimum=0.0, maximum=1.0), "the least composite score")
PREFER = query_param(
    "prefer",
    Value("string", enum=PREFERENCES),
    "recent: recency leads; relevant: it only breaks ties (absent: the query's words decide)",
)
SEARCH_KINDS = query_param(
    "kinds",
    choices(KINDS),
    "what to return (repeat or comma-separate): minute (the default), fact, summary (chunk and "
    "episode summaries); with any but minute the answer also has ranked",
)
SEARCH_PARAMS = (
    query_param("q", Value("string", min_length=1), "the search text", "conflict resolved"),
    SEARCH_K,
    query_param("category", STRINGS, "categories (repeat the parameter, or comma-separate)"),
    query_param("event_type", STRINGS, "event types (repeat, or comma-separate)"),
    query_param("agent", STRINGS, "agent ids (repeat, or comma-separate)"),
    query_param("task_id", STRING, "one task"),
    query_param("thread_id", STRING, "one thread"),
    SINCE_MS,
    UNTIL_MS,
    MIN_COMPOSITE,
    PREFER,
    query_param("include_pruned", STRING, "true: also minutes the evaluate pool pruned (the log keeps them)"),
    SEARCH_KINDS,
)
RECENT_N = query_param("n", integer(1, RECENT_MAX, RECENT_DEFAULT), "how many")
RECENT_PARAMS = (RECENT_N,)
# The server's PVM_SUMMARY_RECENT is the default it reads (`integer(request, default=...)`); the document shows
# the shipped one.
THREAD_RECENT = query_param("recent", integer(0, RECENT_MAX, defaults.SUMMARY_RECENT), "how many of its newest minutes")
THREAD_PARAMS = (
    path_param(
        "thread",
        Value("string", min_length=1),
        "a thread id (thread:<id> when it starts with task: or thread:), task:<task id>, or project",
        "task:T-1",
    ),
    THREAD_RECENT,
)
BY_IDS_PARAMS = (
    query_param(
        "ids",
        # One string, not an array: empty entries are ignored, and at least one id is required.
        Value("string", pattern="[^,]"),
        f"minute ids, comma-separated (at most {defaults.API_MAX_BATCH})",
        "01M8BMRD8028T5CY4TQKFF04HM,01M8BMV54G1W7GY3RF1W7GY3RF",
    ),
)
