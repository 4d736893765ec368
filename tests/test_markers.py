"""The `integration` marker that tests/conftest.py applies: every name it lists exists, and it matches only those."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import INTEGRATION, is_integration

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("entry", INTEGRATION)
def test_every_listed_integration_test_exists(entry: str) -> None:
    path, _, name = entry.partition("::")
    module = ROOT / path
    assert module.is_file(), f"{entry}: no such module; update INTEGRATION in tests/conftest.py"
    if name:
        tree = ast.parse(module.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert name in defined, f"{entry}: no such test; update INTEGRATION in tests/conftest.py"


def test_the_list_has_no_duplicates() -> None:
    assert len(set(INTEGRATION)) == len(INTEGRATION)


def test_a_listed_module_or_test_matches_with_every_parametrization_and_nothing_else() -> None:
    assert is_integration("tests/test_up.py::test_pvm_up_runs_the_pipeline")
    assert not is_integration("tests/test_upgrade.py::test_x")
    test = "tests/workers/ops/test_cli.py::test_serve_with_an_unusable_tokens_file_exits_with_one_line"
    assert is_integration(test)
    assert is_integration(f"{test}[{{not json-is not JSON]")
    assert not is_integration(f"{test}_too")
    assert not is_integration("tests/workers/ops/test_cli.py::test_settings_refuse_bad_values")


@pytest.mark.integration
def test_make_test_fast_selects_by_the_marker() -> None:
    modules = ["tests/test_up.py", "tests/workers/ops/test_cli.py"]
    selected = {marks: collected(["-m", marks, *modules]) for marks in ("integration", "not slow and not integration")}
    assert "tests/test_up.py::test_pvm_up_runs_the_pipeline_and_stops_cleanly_on_ctrl_c" in selected["integration"]
    assert "tests/workers/ops/test_cli.py::test_help_lists_every_command" in selected["integration"]
    unit = selected["not slow and not integration"]
    assert "tests/workers/ops/test_cli.py::test_settings_refuse_bad_values" in unit
    assert not {test for test in unit if is_integration(test)}


def collected(args: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {line for line in out.stdout.splitlines() if "::" in line}
