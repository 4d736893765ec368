"""Every third-party package that contracts/, pvm/ or workers/ imports is declared in pyproject.toml.

Each import of every module (function-level ones and those under TYPE_CHECKING too) is read from its
source with ast; what is not the standard library or our own packages must be a distribution named in
[project] dependencies or one of [project.optional-dependencies]' groups. A package that only arrives as
another one's dependency (pydantic under mcp, say) works until that package drops it: what we import, we
declare.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("contracts", "pvm", "workers")
FIRST_PARTY = frozenset({"contracts", "pvm", "workers", "bench", "tests"})
STDLIB = frozenset(sys.stdlib_module_names)

# Import name -> distribution name, where they differ by more than "_" for "-" and case.
DISTRIBUTION_OF = {
    "yaml": "pyyaml",
    "qdrant_edge": "qdrant-edge-py",
}

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """A distribution's normalized name (PEP 503): lower case, runs of "-", "_" and "." one "-"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: Mapping[str, Any]) -> frozenset[str]:
    """The canonical names of every distribution pyproject declares: the dependencies and every extra."""
    project = pyproject["project"]
    requirements: list[str] = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        requirements.extend(group)
    names = set()
    for requirement in requirements:
        match = _REQUIREMENT_NAME.match(requirement)
        assert match, f"cannot read the name of requirement {requirement!r}"
        names.add(canonical(match.group(1)))
    return frozenset(names)


def third_party_imports(source: str) -> list[tuple[str, int]]:
    """(top-level import name, line) of every absolute import in `source` that is neither stdlib nor ours."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.extend((top, node.lineno) for top in (n.split(".")[0] for n in names) if top not in STDLIB | FIRST_PARTY)
    return sorted(found, key=lambda item: item[1])


def distribution(import_name: str) -> str:
    return canonical(DISTRIBUTION_OF.get(import_name, import_name))


def undeclared(sources: dict[str, str], names: frozenset[str]) -> list[str]:
    """ "<path>:<line>: imports ..." for each import in `sources` (path -> text) of a distribution not in `names`."""
    return [
        f"{path}:{line}: imports {top!r} (distribution {distribution(top)!r})"
        for path, source in sources.items()
        for top, line in third_party_imports(source)
        if distribution(top) not in names
    ]


@pytest.fixture(scope="module")
def names() -> frozenset[str]:
    return declared(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8")))


@pytest.mark.parametrize("package", CHECKED)
def test_every_third_party_import_is_declared(package: str, names: frozenset[str]) -> None:
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted((ROOT / package).rglob("*.py"))}
    assert sources, f"no modules found under {package}/"
    missing = undeclared(sources, names)
    assert not missing, (
        "declare these in pyproject.toml (a dependency, or the extra that needs it, with a comment saying why),"
        " or add the import name to DISTRIBUTION_OF if the distribution is named differently:\n" + "\n".join(missing)
    )


def test_the_import_name_map_names_only_declared_distributions(names: frozenset[str]) -> None:
    assert {canonical(d) for d in DISTRIBUTION_OF.values()} <= names


def test_an_undeclared_import_is_found_wherever_it_stands() -> None:
    source = (
        "from __future__ import annotations\n"
        "import json\n"
        "from typing import TYPE_CHECKING\n"
        "import redis.asyncio\n"
        "from pvm import defaults\n"
        "from . import config\n"
        "if TYPE_CHECKING:\n"
        "    import requests\n"
        "def later() -> None:\n"
        "    from yaml import safe_load\n"
        "    import not_declared.sub\n"
    )
    assert third_party_imports(source) == [("redis", 4), ("requests", 8), ("yaml", 10), ("not_declared", 11)]
    assert undeclared({"probe.py": source}, frozenset({"redis", "pyyaml"})) == [
        "probe.py:8: imports 'requests' (distribution 'requests')",
        "probe.py:11: imports 'not_declared' (distribution 'not-declared')",
    ]


def test_requirement_names_are_read_and_normalized() -> None:
    pyproject = {
        "project": {
            "dependencies": ["redis[hiredis]>=5.0,<9", "Qdrant_Edge.Py>=0.9"],
            "optional-dependencies": {"extra": ["PyYAML>=6 ; python_version >= '3.11'"]},
        }
    }
    assert declared(pyproject) == {"redis", "qdrant-edge-py", "pyyaml"}
