"""pvm.json_schema agrees with `jsonschema` (Draft 2020-12) on the subset it supports, and refuses the rest."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pvm.json_schema import JSONSchema, SchemaError

NAMES = ["a", "b", "type", "value", "x-y"]  # property names schemas and values share, so they meet
WORDS = ["", "a", "ab", "abc", "fact", "Fact", "1", "zz"]

_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from([0.0, 1.0, 1.5, -2.5, 3.0, 1e300, 0.1])
    | st.sampled_from(WORDS)
)
json_values = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(NAMES), inner, max_size=4),
    max_leaves=12,
)

_number = st.sampled_from([0, 1, 2, -1, 0.5, 2.5, 3, 1.5])
_leaf_schema: st.SearchStrategy[Any] = st.one_of(
    st.booleans(),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array", "string", "number", "integer", "boolean", "null"])}
    ),
    st.fixed_dictionaries({"type": st.lists(st.sampled_from(["string", "integer", "null"]), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"enum": st.lists(_scalar, min_size=1, max_size=4)}),
    st.fixed_dictionaries({"const": _scalar}),
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={
            "minLength": st.integers(0, 3),
            "maxLength": st.integers(0, 3),
            "pattern": st.sampled_from(["^a", "b", "^[a-z]+$", "\\d"]),
        },
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "minimum": _number,
            "maximum": _number,
            "exclusiveMinimum": _number,
            "exclusiveMaximum": _number,
            "multipleOf": st.sampled_from([1, 2, 0.5, 0.1, 3]),
        },
    ),
)


def _composite(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object")},
            optional={
                "properties": st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
                "required": st.lists(st.sampled_from(NAMES), max_size=3, unique=True),
                "additionalProperties": inner,
                "minProperties": st.integers(0, 3),
                "maxProperties": st.integers(0, 3),
            },
        ),
        st.fixed_dictionaries(
            {},
            optional={
                "items": inner,
                "minItems": st.integers(0, 3),
                "maxItems": st.integers(0, 3),
                "uniqueItems": st.booleans(),
            },
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"not": inner}),
    )


schemas = st.recursive(_leaf_schema, _composite, max_leaves=8)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, value=json_values)
def test_verdicts_equal_jsonschemas(schema: Any, value: Any) -> None:
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    checked = JSONSchema(schema)
    assert checked.is_valid(value) == expected
    assert (not checked.errors(value)) == expected


@settings(max_examples=200, deadline=None)
@given(schema=schemas)
def test_a_value_made_to_fit_is_valid_in_both(schema: Any) -> None:
    # Random values mostly miss an object schema's `required`; these are built to satisfy the first level.
    value: Any = None
    if isinstance(schema, dict) and schema.get("type") == "object":
        value = {name: None for name in schema.get("required", [])}
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert JSONSchema(schema).is_valid(value) == expected


_numeric_schema = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["number", "integer"]),
        "minimum": _number,
        "maximum": _number,
        "exclusiveMinimum": _number,
        "exclusiveMaximum": _number,
        "multipleOf": st.sampled_from([1, 2, 0.5, 0.1, 3, 0.25]),
    },
)
_numbers = (
    st.integers(-10, 10) | st.sampled_from([0.0, 1.0, 0.5, 1.5, 2.5, 0.3, 0.7, 3.0, 1e300, 1e-300]) | st.booleans()
)


@settings(max_examples=400, deadline=None)
@given(schema=_numeric_schema, value=_numbers)
def test_number_verdicts_equal_jsonschemas(schema: Any, value: Any) -> None:
    assert JSONSchema(schema).is_valid(value) == jsonschema.Draft202012Validator(schema).is_valid(value)


_items = st.lists(st.sampled_from([0, 1, 1.0, True, False, None, "a", "1"]) | st.just([1]) | st.just({"a": 1}))


@settings(max_examples=300, deadline=None)
@given(unique=st.booleans(), value=_items)
def test_unique_items_equal_jsonschemas(unique: bool, value: list[Any]) -> None:
    schema = {"type": "array", "uniqueItems": unique}
    assert JSONSchema(schema).is_valid(value) == jsonschema.Draft202012Validator(schema).is_valid(value)


FACTS = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": 3,
            "items": {"$ref": "#/$defs/fact"},
        }
    },
    "required": ["facts"],
    "additionalProperties": False,
    "$defs": {
        "fact": {
            "type": "object",
            "properties": {
                "type": {"enum": ["fact", "decision"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "value": {"type": ["string", "null"], "description": "the value, if the fact has one"},
            },
            "required": ["type", "confidence"],
        }
    },
}


def test_errors_say_where_and_what() -> None:
    checked = JSONSchema(FACTS)
    assert checked.errors({"facts": []}) == []
    errors = checked.errors(
        {"facts": [{"type": "opinion", "confidence": 2}, {"confidence": "high", "value": 3}], "extra": 1}
    )
    assert errors == [
        "$.facts[0].type: 'opinion' is not one of ['fact', 'decision']",
        "$.facts[0].confidence: 2 is above the maximum 1",
        "$.facts[1]: required property 'type' is missing",
        "$.facts[1].confidence: 'high' is not of type number",
        "$.facts[1].value: 3 is not of type string or null",
        "$: property 'extra' is not allowed (allowed: facts)",
    ]
    assert checked.errors({"facts": [{}, {}, {}, {}]}, limit=1) == ["$.facts: has 4 items, more than 3"]
    assert jsonschema.Draft202012Validator(FACTS).is_valid({"facts": [{"type": "fact", "confidence": 1.0}]})
    assert checked.is_valid({"facts": [{"type": "fact", "confidence": 1.0}]})


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "patternProperties": {"^a": {}}}, "#/patternProperties"),
        ({"properties": {"a": {"if": {"type": "string"}}}}, "#/properties/a/if"),
        ({"type": "text"}, "#/type"),
        ({"$ref": "https://example.com/schema.json"}, "#/$ref"),
        ({"items": [{"type": "string"}]}, "#/items"),
        ({"pattern": "("}, "#/pattern"),
        ({"minItems": -1}, "#/minItems"),
        ({"multipleOf": 0}, "#/multipleOf"),
        ([], "#"),
    ],
)
def test_what_it_cannot_check_is_refused_when_built(schema: Any, where: str) -> None:
    with pytest.raises(SchemaError, match=f"^{where.replace('$', '[$]')}: "):
        JSONSchema(schema)
