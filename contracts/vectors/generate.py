"""Regenerate the golden ``.msgpack`` vectors from their ``.json`` twins, and the wire-only invalid vectors.

Run ``python -m contracts.vectors.generate`` after adding or editing a vector;
``--check`` only verifies (exit status 1 if any ``.msgpack`` is missing, stale or
orphaned, or a ``.json`` is not in canonical wire form) and writes nothing.

Each ``<name>.json`` holds one minute in wire form including ``"v"``; its
``<name>.msgpack`` is ``encode_minute(Minute.from_dict(json_without_v))``.

``invalid/<name>.msgpack`` (with ``invalid/<name>.json`` naming the field) are
minutes a decoder must refuse that JSON cannot write (NaN, Infinity, bin,
msgpack extension types) or the JSON Schema cannot express (nesting deeper
than ``MAX_JSON_DEPTH``); both files are written from `wire_invalid_cases`.

``facts/<name>.json`` holds one fact in `Fact.to_dict()` form. Its ``"id"`` is
the fact's deterministic id: leave it out of a new vector and the generator
fills it in (``--check`` reports it missing); a wrong one is reported, never
rewritten. ``facts/ids.json`` (written from `id_cases`) pins normalization,
slot digests and fact ids for implementations in other languages.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import msgpack

from contracts.codec import SCHEMA_VERSION, encode_minute
from contracts.errors import ContractError
from contracts.facts import FACT_NAMESPACE, Fact, Slot, TierKey, fact_id, normalize_value
from contracts.json_value import MAX_JSON_DEPTH
from contracts.minute import Minute

VECTORS_DIR = Path(__file__).resolve().parent
INVALID_DIR = "invalid"
FACTS_DIR = "facts"
IDS_FILE = "ids.json"


def _nested(levels: int) -> dict[str, Any]:
    """`levels` nested maps, each holding the next under "n", the innermost holding "n": 1."""
    value: Any = 1
    for _ in range(levels):
        value = {"n": value}
    return dict(value)


def wire_invalid_cases() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """name -> (description, field, the minute map with "v") for invalid vectors only msgpack can write."""
    base: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "id": "01M8BNA1B8T1EXJ0Y2QAYA4H4B",
        "timestamp": "2026-11-26T10:10:00.000000Z",
        "event_type": "evaluation",
        "project_id": "alpha",
        "data": {},
        "context_references": [],
        "scope": "project",
    }
    cases: dict[str, tuple[str, str, Any]] = {
        "data_nan": ("data is JSON: NaN is not a JSON number", "data.ratio", {"ratio": math.nan}),
        "data_infinity": (
            "data is JSON: Infinity is not a JSON number, at any depth",
            "data.limits.max",
            {"limits": {"max": math.inf}},
        ),
        "data_negative_infinity": (
            "data is JSON: -Infinity is not a JSON number, in arrays too",
            "data.samples[1]",
            {"samples": [1.5, -math.inf]},
        ),
        "data_bin_value": (
            "data is JSON: a msgpack bin value has no JSON form (send text, e.g. base64)",
            "data.blob",
            {"blob": b"\x00\x01\x02"},
        ),
        "data_bin_key": (
            "data is JSON: map keys are strings at every depth, never bin",
            "data.headers",
            {"headers": {b"etag": "x"}},
        ),
        "data_ext_timestamp": (
            "data is JSON: a msgpack extension (here the timestamp type -1) has no JSON form",
            "data.when",
            {"when": msgpack.Timestamp(1795658769, 0)},
        ),
        "data_too_deep": (
            f"data nests at most {MAX_JSON_DEPTH} levels, counting data itself (JSON Schema cannot count levels)",
            "data" + ".n" * MAX_JSON_DEPTH,
            _nested(MAX_JSON_DEPTH + 1),
        ),
    }
    return {name: (description, field, {**base, "data": data}) for name, (description, field, data) in cases.items()}


def wire_invalid_files(directory: Path = VECTORS_DIR) -> dict[Path, bytes]:
    """Every wire-only invalid vector file under `directory`, with the bytes it must hold."""
    files: dict[Path, bytes] = {}
    for name, (description, field, minute) in wire_invalid_cases().items():
        stem = directory / INVALID_DIR / name
        sidecar = {"description": description, "field": field, "msgpack": f"{name}.msgpack"}
        files[stem.with_suffix(".json")] = (json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n").encode()
        files[stem.with_suffix(".msgpack")] = msgpack.packb(minute, use_bin_type=True, datetime=False)
    return files


# -- facts --------------------------------------------------------------------------------------------------------


def id_cases() -> list[tuple[str, str, str, str | int | float | bool, int]]:
    """(tier key, subject, attribute, value, period) whose normalized forms, digests and ids `facts/ids.json` pins."""
    return [(*case, 0) for case in _first_period_cases()] + [
        ("project:beta", "db", "engine", "Postgres\t16", 1),  # the value came back: its second period
        ("project:beta", "db", "engine", "Postgres\t16", 12),
    ]


def _first_period_cases() -> list[tuple[str, str, str, str | int | float | bool]]:
    return [
        ("project:alpha", "service:auth", "session_ttl", "30m"),
        ("project:alpha", "  Service:Auth ", "Session_TTL", " 30M "),  # the same fact as the first
        ("task:alpha:T-1042", "service:auth", "session_ttl", "30m"),
        ("global", "service:auth", "session_ttl", "30m"),
        ("project:beta", "db", "engine", "Postgres\t16"),
        ("project:alpha", "a|b", "c", "v"),  # netstrings: not the same name as the next
        ("project:alpha", "a", "b|c", "v"),
        ("task:alpha:deploy: step 2", "Straße", "\uff34\uff34\uff2c", "caf\u0065\u0301"),  # casefold, NFKC
        ("project:alpha", "learned", "max_retries", 3),
        ("project:alpha", "learned", "ratio", 0.25),
        ("project:alpha", "learned", "ratio", 16.0),
        ("project:alpha", "learned", "enabled", True),
        ("project:alpha", "\U0001f680 launch", "window", "Tuesday\u00a0mornings"),  # NBSP is whitespace
    ]


def id_vector() -> dict[str, Any]:
    """The document `facts/ids.json` must hold."""
    cases = []
    for tier_key, subject, attribute, value, period in id_cases():
        key = TierKey.parse(tier_key)
        slot = Slot(subject, attribute)
        normalized = normalize_value(value)
        parts = [str(key), slot.subject, slot.attribute, normalized] + ([str(period)] if period else [])
        name = "".join(f"{len(p.encode('utf-8'))}:{p}," for p in parts)
        case: dict[str, Any] = {"tier_key": tier_key, "subject": subject, "attribute": attribute, "value": value}
        if period:
            case["period"] = period
        cases.append(
            {
                **case,
                "slot": {"subject": slot.subject, "attribute": slot.attribute},
                "normalized_value": normalized,
                "slot_digest": slot.digest,
                "uuid5_name": name,
                "fact_id": fact_id(key, slot, value, period),
            }
        )
    return {
        "description": (
            "Fact identity, for implementations in other languages. slot: subject and attribute normalized "
            "(NFKC, case fold, NFKC, whitespace runs collapsed to one space, ends stripped). normalized_value: "
            "text normalized the same way; numbers and booleans canonical (16.0 -> 16, true). slot_digest: the "
            "first 32 hex digits of SHA-256 over the netstrings of slot subject and attribute. uuid5_name: the "
            "netstrings ('<UTF-8 byte length>:<text>,') of tier key, slot subject, slot attribute, normalized "
            "value, and when period is present (above 0: the value held in the slot before, was replaced and came "
            "back) the period in decimal. fact_id: uuid5(namespace, uuid5_name)."
        ),
        "namespace": str(FACT_NAMESPACE),
        "cases": cases,
    }


def _json_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def fact_vector_paths(directory: Path = VECTORS_DIR) -> list[Path]:
    """Every valid-fact ``.json`` under ``facts/`` (not ``ids.json``, not the ``invalid*`` cases)."""
    return sorted(p for p in (directory / FACTS_DIR).glob("*.json") if p.name != IDS_FILE)


def fact_from_vector(doc: dict[str, Any]) -> Fact:
    """The `Fact` a fact vector describes, its id computed when the vector leaves it out."""
    if "id" not in doc:
        slot = Slot(doc["subject"], doc["attribute"])
        doc = {"id": fact_id(TierKey.parse(doc["tier_key"]), slot, doc["value"], doc.get("period", 0)), **doc}
    return Fact.from_dict(doc)


def _fact_problems(directory: Path) -> list[str]:
    found: list[str] = []
    for path in fact_vector_paths(directory):
        name = f"{FACTS_DIR}/{path.name}"
        doc = load_vector(path)
        if "id" not in doc:
            found.append(f"{name}: no id (run the generator to fill it in)")
            continue
        try:
            fact = Fact.from_dict(doc)
        except ContractError as exc:
            found.append(f"{name}: {exc}")
            continue
        canonical = fact.to_dict()
        if list(doc) != list(canonical) or doc != canonical:
            found.append(f"{name}: not in canonical form (Fact.to_dict(): every field, in order)")
    ids = directory / FACTS_DIR / IDS_FILE
    if not ids.exists():
        found.append(f"{FACTS_DIR}/{IDS_FILE}: missing")
    elif ids.read_bytes() != _json_bytes(id_vector()):
        found.append(f"{FACTS_DIR}/{IDS_FILE}: stale (normalization or ids changed?)")
    return found


def _fact_files(directory: Path) -> dict[Path, bytes]:
    """Fact vectors without an id, completed, and ``ids.json``."""
    files = {directory / FACTS_DIR / IDS_FILE: _json_bytes(id_vector())}
    for path in fact_vector_paths(directory):
        doc = load_vector(path)
        if "id" not in doc:
            files[path] = _json_bytes(fact_from_vector(doc).to_dict())
    return files


def load_vector(path: Path) -> dict[str, Any]:
    """The JSON form of a vector, as written (including ``"v"``)."""
    with path.open(encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict):
        raise ValueError(f"{path.name}: expected a JSON object")
    return doc


def minute_from_vector(doc: dict[str, Any]) -> Minute:
    """Build the `Minute` a vector describes; its ``"v"`` must be the current schema version."""
    body = dict(doc)
    version = body.pop("v", None)
    if version != SCHEMA_VERSION or type(version) is not int:
        raise ValueError(f"vector has v={version!r}; this build writes v={SCHEMA_VERSION}")
    return Minute.from_dict(body)


def expected_bytes(path: Path) -> bytes:
    """The msgpack bytes the vector at `path` must hold."""
    return encode_minute(minute_from_vector(load_vector(path)))


def vector_paths(directory: Path = VECTORS_DIR) -> list[Path]:
    """Every valid-vector ``.json`` in `directory` (the ``invalid/`` cases are not encoded)."""
    return sorted(directory.glob("*.json"))


def problems(directory: Path = VECTORS_DIR) -> list[str]:
    """What is out of date in `directory`; empty when every vector is canonical and encoded."""
    found: list[str] = []
    for path in vector_paths(directory):
        doc = load_vector(path)
        try:
            minute = minute_from_vector(doc)
        except ValueError as exc:
            found.append(f"{path.name}: {exc}")
            continue
        canonical = {"v": SCHEMA_VERSION, **minute.to_dict()}
        if list(doc) != list(canonical) or doc != canonical:
            found.append(f"{path.name}: not in canonical wire form (key order {list(canonical)}, nulls omitted)")
        packed = path.with_suffix(".msgpack")
        if not packed.exists():
            found.append(f"{packed.name}: missing")
        elif packed.read_bytes() != encode_minute(minute):
            found.append(f"{packed.name}: stale")
    json_stems = {p.stem for p in vector_paths(directory)}
    orphans = [p for p in sorted(directory.glob("*.msgpack")) if p.stem not in json_stems]
    found.extend(f"{p.name}: no matching .json" for p in orphans)
    wire = wire_invalid_files(directory)
    for path, raw in wire.items():
        name = f"{INVALID_DIR}/{path.name}"
        if not path.exists():
            found.append(f"{name}: missing")
        elif path.read_bytes() != raw:
            found.append(f"{name}: stale")
    stray = [p for p in sorted((directory / INVALID_DIR).glob("*.msgpack")) if p not in wire]
    found.extend(f"{INVALID_DIR}/{p.name}: not a case of wire_invalid_cases" for p in stray)
    found.extend(_fact_problems(directory))
    return found


def generate(directory: Path = VECTORS_DIR) -> list[Path]:
    """Write each ``.msgpack`` (and wire-only invalid vector) whose bytes are out of date; returns the paths written."""
    wanted = {path.with_suffix(".msgpack"): expected_bytes(path) for path in vector_paths(directory)}
    wanted.update(wire_invalid_files(directory))
    wanted.update(_fact_files(directory))
    written = []
    for path, raw in wanted.items():
        if not path.exists() or path.read_bytes() != raw:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(raw)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contracts.vectors.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify only; exit 1 if anything is out of date")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        print(f"{len(vector_paths())} vectors, {len(fact_vector_paths())} fact vectors, {len(found)} problem(s)")
        return 1 if found else 0
    written = generate()
    for path in written:
        print(f"wrote {path.relative_to(VECTORS_DIR.parent.parent)}")
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    counts = f"{len(vector_paths())} vectors, {len(fact_vector_paths())} fact vectors"
    print(f"{counts}, {len(written)} written, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
