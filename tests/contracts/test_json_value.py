"""`contracts.json_value`: the data rule's walk, and the safe encoding reads use for data stored before it."""

from __future__ import annotations

import json
import math
from enum import IntEnum
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import InvalidMinute, Scope
from contracts.json_value import MAX_JSON_DEPTH, SAFE_DEPTH, TOO_DEEP, check_json, json_safe


class Level(IntEnum):
    HIGH = 3


def test_check_json_names_the_path_through_maps_and_arrays() -> None:
    with pytest.raises(InvalidMinute) as info:
        check_json("data", {"a": [{"b": 1}, {"c": [None, math.nan]}]})
    assert info.value.field == "data.a[1].c[1]"
    assert str(info.value).startswith("invalid minute: data.a[1].c[1]: NaN is not a JSON number")


def test_check_json_reads_subclasses_as_their_base() -> None:
    check_json("data", {"scope": Scope.TASK, "level": Level.HIGH})
    with pytest.raises(InvalidMinute):
        check_json("data", {"x": type("Huge", (int,), {})(2**64)})


def test_depth_counts_the_value_itself() -> None:
    value: Any = []
    for _ in range(MAX_JSON_DEPTH - 1):
        value = [value]
    check_json("data", value)
    with pytest.raises(InvalidMinute) as info:
        check_json("data", [value])
    assert info.value.field == "data" + "[0]" * MAX_JSON_DEPTH


def test_json_safe_replaces_only_what_json_cannot_hold() -> None:
    stored = {
        "nan": math.nan,
        "inf": [math.inf, -math.inf],
        "bytes": b"\x00\x01\xfe",
        "keys": {3: "int", b"k": "bytes"},
        "tuple": (1, 2),
        "set": {7},
        "ext": msgpack.ExtType(5, b"x"),
        "when": msgpack.Timestamp(0, 0),
        "fine": {"a": [1, 2.5, "x", None, True]},
    }
    safe = json_safe(stored)
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert safe["nan"] is None and safe["inf"] == [None, None]
    assert safe["bytes"] == "AAH+" and safe["keys"] == {"3": "int", "aw==": "bytes"}
    assert safe["tuple"] == [1, 2] and safe["set"] == [7]
    assert isinstance(safe["ext"], str) and isinstance(safe["when"], str)
    assert safe["fine"] == stored["fine"]


def test_json_safe_stops_at_its_depth() -> None:
    value: Any = 1
    for _ in range(SAFE_DEPTH + 50):
        value = [value]
    safe = json_safe(value)
    for _ in range(SAFE_DEPTH):
        safe = safe[0]
    assert safe == TOO_DEEP


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=15,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_safe_leaves_json_values_equal(value: Any) -> None:
    assert json_safe(value) == value
