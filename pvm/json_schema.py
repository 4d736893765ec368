"""JSON Schema validation of model answers, for the subset of the 2020-12 vocabulary PVM's own schemas use.

An LLM's answer is data PVM did not write: `pvm.llm` checks it against the
schema the caller asked for before anything else sees it. The `jsonschema`
package does that fully, but it is a dev dependency (with rpds-py, a compiled
core, and ~0.1 s of import): the server extra carries this module instead, and
a property test (tests/pvm/test_json_schema.py) holds its verdicts equal to
`jsonschema`'s Draft 2020-12 validator over generated schemas and values.

Supported: `type` (one or a list), `enum`, `const`; `properties`, `required`,
`additionalProperties`, `minProperties`, `maxProperties`; `items`,
`minItems`, `maxItems`, `uniqueItems`; `minimum`, `maximum`,
`exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`; `minLength`,
`maxLength`, `pattern`; `anyOf`, `oneOf`, `allOf`, `not`; `$ref` to
`#/$defs/...` or `#/definitions/...`; `true` / `false` schemas. Annotations
(`title`, `description`, `default`, `examples`, `format`, ...) are ignored, as
a 2020-12 validator does by default. Any other keyword is refused when the
schema is built (`SchemaError`), so a schema never validates less than it says.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "$anchor",
        "title",
        "description",
        "default",
        "examples",
        "format",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
    }
)
_CHECKED = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "$defs",
        "definitions",
    }
)
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_REF = re.compile(r"#/(\$defs|definitions)/([^/]+)")


class SchemaError(ValueError):
    """A schema this module cannot check fully (an unsupported keyword, a malformed value); names where."""


class JSONSchema:
    """A checked schema: `errors(value)` lists why a value does not match it (empty: it does)."""

    def __init__(self, schema: Mapping[str, Any] | bool) -> None:
        self.schema = schema
        self._definitions: dict[str, Any] = {}
        if isinstance(schema, Mapping):
            for section in ("$defs", "definitions"):
                for name, sub in (schema.get(section) or {}).items():
                    self._definitions[f"#/{section}/{name}"] = sub
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._check(schema, "#")

    def is_valid(self, value: Any) -> bool:
        return next(self._errors(value, self.schema, "$"), None) is None

    def errors(self, value: Any, limit: int = 10) -> list[str]:
        """Up to `limit` reasons, each "<where>: <what>" with `where` a path like `$.facts[2].type`."""
        found: list[str] = []
        for error in self._errors(value, self.schema, "$"):
            found.append(error)
            if len(found) >= limit:
                break
        return found

    # -- the schema itself --

    def _check(self, schema: Any, where: str) -> None:
        if isinstance(schema, bool):
            return
        if not isinstance(schema, Mapping):
            raise SchemaError(f"{where}: a schema is an object or a boolean, not {type(schema).__name__}")
        for keyword, value in schema.items():
            at = f"{where}/{keyword}"
            if keyword in _ANNOTATIONS:
                continue
            if keyword not in _CHECKED:
                raise SchemaError(
                    f"{at}: keyword {keyword!r} is not supported by pvm.json_schema: use the supported subset "
                    "(see the module docstring) so that answers are checked against all of the schema"
                )
            if keyword == "type":
                names = value if isinstance(value, list) else [value]
                if not names or any(name not in _TYPES for name in names):
                    raise SchemaError(f"{at}: {value!r} is not a JSON type or a list of them")
            elif keyword in ("properties", "$defs", "definitions"):
                if not isinstance(value, Mapping):
                    raise SchemaError(f"{at}: must be an object of schemas")
                for name, sub in value.items():
                    self._check(sub, f"{at}/{name}")
            elif keyword in ("additionalProperties", "items", "not"):
                self._check(value, at)
            elif keyword in ("anyOf", "oneOf", "allOf"):
                if not isinstance(value, list) or not value:
                    raise SchemaError(f"{at}: must be a non-empty list of schemas")
                for i, sub in enumerate(value):
                    self._check(sub, f"{at}/{i}")
            elif keyword == "required":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise SchemaError(f"{at}: must be a list of property names")
            elif keyword == "enum":
                if not isinstance(value, list):
                    raise SchemaError(f"{at}: must be a list")
            elif keyword == "pattern":
                if not isinstance(value, str):
                    raise SchemaError(f"{at}: must be a regular expression")
                try:
                    self._patterns[value] = re.compile(value)
                except re.error as error:
                    raise SchemaError(f"{at}: {value!r} is not a regular expression ({error})") from None
            elif keyword == "$ref":
                if not isinstance(value, str) or value not in self._definitions:
                    raise SchemaError(f"{at}: {value!r} is not a reference to this schema's $defs or definitions")
            elif keyword == "uniqueItems":
                if not isinstance(value, bool):
                    raise SchemaError(f"{at}: must be true or false")
            elif keyword in ("minProperties", "maxProperties", "minItems", "maxItems", "minLength", "maxLength"):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise SchemaError(f"{at}: must be a whole number >= 0")
            elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise SchemaError(f"{at}: must be a number")
                if keyword == "multipleOf" and value <= 0:
                    raise SchemaError(f"{at}: must be a number above 0")

    # -- a value against it --

    def _errors(self, value: Any, schema: Any, path: str) -> Iterator[str]:
        if schema is True:
            return
        if schema is False:
            yield f"{path}: no value is allowed here"
            return
        if "$ref" in schema:
            yield from self._errors(value, self._definitions[schema["$ref"]], path)
        if "type" in schema:
            names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_is_type(value, name) for name in names):
                yield f"{path}: {_show(value)} is not of type {' or '.join(names)}"
                return  # the other keywords would only repeat it
        if "enum" in schema and not any(_equal(value, option) for option in schema["enum"]):
            yield f"{path}: {_show(value)} is not one of {_show(schema['enum'])}"
        if "const" in schema and not _equal(value, schema["const"]):
            yield f"{path}: {_show(value)} is not {_show(schema['const'])}"
        if isinstance(value, dict):
            yield from self._object_errors(value, schema, path)
        elif isinstance(value, list):
            yield from self._array_errors(value, schema, path)
        elif isinstance(value, str):
            yield from self._string_errors(value, schema, path)
        elif _is_number(value):
            yield from _number_errors(value, schema, path)
        yield from self._combinator_errors(value, schema, path)

    def _object_errors(self, value: dict[str, Any], schema: Mapping[str, Any], path: str) -> Iterator[str]:
        for name in schema.get("required", ()):
            if name not in value:
                yield f"{path}: required property {name!r} is missing"
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            yield f"{path}: has {len(value)} properties, fewer than {schema['minProperties']}"
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            yield f"{path}: has {len(value)} properties, more than {schema['maxProperties']}"
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            where = _child(path, name)
            if name in properties:
                yield from self._errors(item, properties[name], where)
            elif extra is False:
                yield f"{path}: property {name!r} is not allowed (allowed: {', '.join(sorted(properties)) or 'none'})"
            else:
                yield from self._errors(item, extra, where)

    def _array_errors(self, value: list[Any], schema: Mapping[str, Any], path: str) -> Iterator[str]:
        if "minItems" in schema and len(value) < schema["minItems"]:
            yield f"{path}: has {len(value)} items, fewer than {schema['minItems']}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield f"{path}: has {len(value)} items, more than {schema['maxItems']}"
        if schema.get("uniqueItems"):
            seen: set[Any] = set()
            for i, item in enumerate(value):
                key = _canonical(item)
                if key in seen:
                    yield f"{path}[{i}]: repeats an earlier item"
                    break
                seen.add(key)
        if "items" in schema:
            for i, item in enumerate(value):
                yield from self._errors(item, schema["items"], f"{path}[{i}]")

    def _string_errors(self, value: str, schema: Mapping[str, Any], path: str) -> Iterator[str]:
        if "minLength" in schema and len(value) < schema["minLength"]:
            yield f"{path}: {_show(value)} is shorter than {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{path}: {_show(value)} is longer than {schema['maxLength']} characters"
        if "pattern" in schema and not self._patterns[schema["pattern"]].search(value):
            yield f"{path}: {_show(value)} does not match {schema['pattern']!r}"

    def _combinator_errors(self, value: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
        for sub in schema.get("allOf", ()):
            yield from self._errors(value, sub, path)
        if "anyOf" in schema and not any(self._matches(value, sub, path) for sub in schema["anyOf"]):
            yield f"{path}: {_show(value)} matches none of the {len(schema['anyOf'])} allowed forms (anyOf)"
        if "oneOf" in schema:
            matched = sum(self._matches(value, sub, path) for sub in schema["oneOf"])
            if matched != 1:
                yield f"{path}: {_show(value)} matches {matched} of the forms in oneOf, not exactly 1"
        if "not" in schema and self._matches(value, schema["not"], path):
            yield f"{path}: {_show(value)} matches a form that is not allowed (not)"

    def _matches(self, value: Any, schema: Any, path: str) -> bool:
        return next(self._errors(value, schema, path), None) is None


def _number_errors(value: float, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    if "minimum" in schema and value < schema["minimum"]:
        yield f"{path}: {_show(value)} is below the minimum {schema['minimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        yield f"{path}: {_show(value)} is above the maximum {schema['maximum']}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        yield f"{path}: {_show(value)} is not above {schema['exclusiveMinimum']}"
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        yield f"{path}: {_show(value)} is not below {schema['exclusiveMaximum']}"
    if "multipleOf" in schema and not _is_multiple(value, schema["multipleOf"]):
        yield f"{path}: {_show(value)} is not a multiple of {schema['multipleOf']}"


def _is_multiple(value: float, step: float) -> bool:
    # As jsonschema decides it: a float step by the quotient (exact fractions when it overflows), else a remainder.
    if isinstance(step, float):
        try:
            quotient = value / step
            return int(quotient) == quotient
        except (OverflowError, ValueError):
            return (Fraction(value) / Fraction(step)).denominator == 1
    return not value % step


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "number":
        return _is_number(value)
    # integer: a whole number, 1.0 included (JSON does not tell 1.0 from 1)
    return _is_number(value) and (isinstance(value, int) or float(value).is_integer())


def _canonical(value: Any) -> Any:
    """A hashable key equal for JSON-equal values: 1 and 1.0 alike, true and 1 not."""
    if isinstance(value, bool):
        return ("boolean", value)
    if _is_number(value):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def _equal(a: Any, b: Any) -> bool:
    return bool(_canonical(a) == _canonical(b))


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"{path}[{name!r}]"


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
