"""Architecture rules that a refactor must not break (STYLE rules 1, 2 and 10)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cdlm"


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_layers_only_point_down():
    """cli > training > evaluation > likelihood > samplers > guidance/regions > processes >
    denoiser/schedules/networks/data: the contract in pyproject.toml."""
    result = subprocess.run(
        ["lint-imports"], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_no_module_is_over_300_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300
    }
    assert not long, f"split these by concept: {long}"


def test_no_process_kind_chains():
    """Callers ask a process what it can do (its capabilities), never which kind it is."""
    hits = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in PACKAGE.rglob("*.py")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"kind\s*[!=]=", line)
    ]
    assert not hits, hits
