"""mypy passes on contracts, pvm and workers with pyproject.toml's settings (the check `make lint` runs)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"mypy failed (run `make lint`):\n{result.stdout}{result.stderr}"


def test_stricter_checks_stay_on() -> None:
    """Returning an untyped library's Any and calling unannotated functions of our own are errors."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert mypy["warn_return_any"] is True
    assert mypy["disallow_untyped_calls"] is True
    assert set(mypy["untyped_calls_exclude"]) <= {"redis", "rq"}, "exclude only third-party packages"
