"""What a minute's free-form `data` may hold: JSON, the one rule for every producer and reader.

`data` crosses JSON (the HTTP API, the JSON Schema, the golden vectors) and
msgpack (the streams, the log). Only values both carry unchanged pass: maps
with string keys at every depth, arrays, strings, booleans, null, finite
numbers, and integers in msgpack's range. Bytes, NaN, ±Infinity, sets,
datetimes and msgpack extension types have no JSON form, so they are refused
where the minute is built (`emit()`, `POST /v1/minutes`, the dispatcher's
decode) instead of dying later in a reader or a JSON response.

`json_safe` goes the other way for data stored before this rule held: it turns
what JSON cannot hold into something it can, so a read never fails on it.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from msgpack import ExtType

from contracts.errors import InvalidMinute

# How many containers deep `data` may nest, counting `data` itself. Coordination
# payloads are a few levels deep; 32 leaves ample room while staying far below
# every recursion limit on the way: Python's (1000, which the JSON parser and any
# recursive reader spend), msgpack-python's packer (511) and serde_json's (128),
# so no producer, reader or response encoder runs out of stack on a valid minute.
MAX_JSON_DEPTH = 32

# msgpack integers: int64 at the bottom, uint64 at the top.
MIN_INT = -(2**63)
MAX_INT = 2**64 - 1

# How deep `json_safe` follows containers (data stored before MAX_JSON_DEPTH held
# may nest up to msgpack-python's 511); deeper ones become the text TOO_DEEP,
# so a reader answering in JSON never meets Python's recursion limit.
SAFE_DEPTH = 256
TOO_DEEP = f"<nested deeper than {SAFE_DEPTH} levels>"


class _NotJson(Exception):
    """Raised deep in the walk; each level on the way out adds its step to the path."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.steps: list[str] = []


class _TooDeep(_NotJson):
    def __init__(self) -> None:
        super().__init__(
            f"nests deeper than {MAX_JSON_DEPTH} levels (counting data itself as one); "
            "flatten the payload or keep the bulk of it outside the minute"
        )


def check_json(field: str, value: Any) -> None:
    """Raise `InvalidMinute` naming the path (e.g. ``data.a.b[2]``) of the first part of `value` that is not JSON.

    `value` itself is the first of `MAX_JSON_DEPTH` levels when it is a
    container. `emit()` runs this in the agent's thread, so the common leaves
    are checked inline and the path is built only while an error travels out.
    """
    try:
        _check(value, MAX_JSON_DEPTH)
    except _NotJson as exc:
        raise InvalidMinute(field + "".join(reversed(exc.steps)), exc.problem) from None


def _check(value: Any, depth: int) -> None:
    """Any value; the containers' loops below check common leaves themselves and call this for the rest."""
    cls = type(value)
    if cls is dict:
        _check_map(value, depth)
    elif cls is list or cls is tuple:
        _check_array(value, depth)
    elif cls is str or cls is bool or value is None:
        return
    elif cls is int:
        if not MIN_INT <= value <= MAX_INT:
            raise _NotJson(
                f"integer {value} is outside the range msgpack carries ({MIN_INT} to {MAX_INT}); send it as a string"
            )
    elif cls is float:
        if not math.isfinite(value):
            name = _float_name(value)
            raise _NotJson(
                f"{name} is not a JSON number (a literal beyond float64, such as 1e400, reads as Infinity); "
                f"send null, or the string {name!r}"
            )
    elif isinstance(value, ExtType):  # a namedtuple, so before the tuple subclasses
        raise _NotJson(f"holds msgpack extension type {value.code}, which JSON cannot carry; send its value as text")
    # Subclasses (a StrEnum, an IntEnum, an OrderedDict) are what their base is.
    elif isinstance(value, str):
        return
    elif isinstance(value, int):
        _check(int(value), depth)
    elif isinstance(value, float):
        _check(float(value), depth)
    elif isinstance(value, dict):
        _check_map(value, depth)
    elif isinstance(value, (list, tuple)):
        _check_array(value, depth)
    else:
        raise _NotJson(_not_json(value))


def _check_map(value: dict[Any, Any], depth: int) -> None:
    if depth < 1:
        raise _TooDeep()
    for key, item in value.items():
        if type(key) is not str and not isinstance(key, str):
            raise _NotJson(f"key {key!r} is not a string; JSON object keys are strings, convert it with str()")
        cls = type(item)
        if cls is str or item is None or cls is bool:
            continue
        if cls is int and MIN_INT <= item <= MAX_INT:
            continue
        if cls is float and item - item == 0.0:  # finite: inf - inf and nan - nan are NaN
            continue
        try:
            _check(item, depth - 1)
        except _NotJson as exc:
            exc.steps.append("." + key)
            raise


def _check_array(value: list[Any] | tuple[Any, ...], depth: int) -> None:
    if depth < 1:
        raise _TooDeep()
    for i, item in enumerate(value):
        cls = type(item)
        if cls is str or item is None or cls is bool:
            continue
        if cls is int and MIN_INT <= item <= MAX_INT:
            continue
        if cls is float and item - item == 0.0:
            continue
        try:
            _check(item, depth - 1)
        except _NotJson as exc:
            exc.steps.append(f"[{i}]")
            raise


def _float_name(value: float) -> str:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def first_unencodable_text(field: str, value: Any) -> str | None:
    """The path of the first string in `value` that UTF-8 cannot encode (a lone surrogate), or None.

    For explaining an encoder failure only: JSON parsers accept ``"\\ud800"``,
    msgpack (UTF-8) cannot carry it.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return field
        return None
    items: Any = ()
    if isinstance(value, dict):
        items = ((f"{field}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{field}[{i}]", v) for i, v in enumerate(value))
    for path, item in items:
        found = first_unencodable_text(path, item)
        if found is not None:
            return found
    return None


def _not_json(value: Any) -> str:
    name = type(value).__name__
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"holds {name} ({len(value)} bytes), which JSON cannot carry; encode them as text first (e.g. base64)"
    if isinstance(value, (set, frozenset)):
        return f"holds a {name}, which JSON cannot carry; send a list"
    return f"holds a {name}, which is not a JSON value; send a string, number, boolean, null, list or string-keyed map"


def json_safe(value: Any, _depth: int = SAFE_DEPTH) -> Any:
    """`value` with everything JSON cannot hold replaced, for answering reads of data stored before `check_json` held.

    NaN and ±Infinity become null (what JavaScript's JSON.stringify writes),
    bytes their base64 text, a non-string map key its text, a tuple or
    set a list, any other object (a msgpack Timestamp or ExtType) its
    ``str()``, and a container nested deeper than `SAFE_DEPTH` levels the text
    `TOO_DEEP`. JSON values come back unchanged (as new containers).
    """
    cls = type(value)
    if cls is str or cls is bool or cls is int or value is None:
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (str, int)):  # subclasses: a StrEnum, an IntEnum
        return str(value) if isinstance(value, str) else int(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, ExtType):  # a namedtuple: its text, not a list
        return str(value)
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        if _depth <= 0:
            return TOO_DEEP
        if isinstance(value, dict):
            return {k if isinstance(k, str) else _key(k): json_safe(v, _depth - 1) for k, v in value.items()}
        return [json_safe(v, _depth - 1) for v in value]
    return str(value)


def _key(key: Any) -> str:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return base64.b64encode(key).decode("ascii")
    return str(key)
