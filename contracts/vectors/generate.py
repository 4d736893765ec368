"""Regenerate the golden ``.msgpack`` vectors from their ``.json`` twins.

Run ``python -m contracts.vectors.generate`` after adding or editing a vector;
``--check`` only verifies (exit status 1 if any ``.msgpack`` is missing, stale or
orphaned, or a ``.json`` is not in canonical wire form) and writes nothing.

Each ``<name>.json`` holds one minute in wire form including ``"v"``; its
``<name>.msgpack`` is ``encode_minute(Minute.from_dict(json_without_v))``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from contracts.codec import SCHEMA_VERSION, encode_minute
from contracts.minute import Minute

VECTORS_DIR = Path(__file__).resolve().parent


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
    return found


def generate(directory: Path = VECTORS_DIR) -> list[Path]:
    """Write every ``.msgpack`` whose bytes differ from its ``.json``; returns the paths written."""
    written = []
    for path in vector_paths(directory):
        raw = expected_bytes(path)
        packed = path.with_suffix(".msgpack")
        if not packed.exists() or packed.read_bytes() != raw:
            packed.write_bytes(raw)
            written.append(packed)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contracts.vectors.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify only; exit 1 if anything is out of date")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        print(f"{len(vector_paths())} vectors, {len(found)} problem(s)")
        return 1 if found else 0
    written = generate()
    for path in written:
        print(f"wrote {path.relative_to(VECTORS_DIR.parent.parent)}")
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    print(f"{len(vector_paths())} vectors, {len(written)} written, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
