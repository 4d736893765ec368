"""mypy passes on contracts, pvm and workers with pyproject.toml's settings (the check `make lint` runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_passes() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"mypy failed (run `make lint`):\n{result.stdout}{result.stderr}"
