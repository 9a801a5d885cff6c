"""Lint and format checks, enforced in CI (configured in pyproject.toml: `[tool.ruff]`, `[tool.snakefmt]`).

Fix what they report with `ruff check --fix .` and `snakefmt Snakefile workflow/rules/*.smk`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    """The tool installed beside this interpreter (the `dev` extra pins it), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: `pip install -e .[dev]` (pyproject.toml pins it)")
    return found


def test_ruff_check_passes():
    proc = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"ruff check . (fix: ruff check --fix .):\n{proc.stdout}{proc.stderr}"


def test_snakefmt_check_passes():
    files = ["Snakefile", *sorted(str(p.relative_to(REPO)) for p in (REPO / "workflow" / "rules").glob("*.smk"))]
    proc = subprocess.run([_tool("snakefmt"), "--check", "--diff", *files], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"snakefmt --check (fix: snakefmt {' '.join(files)}):\n{proc.stdout}{proc.stderr}"
