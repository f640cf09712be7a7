"""Architecture rules that a refactor must not break (STYLE rules 1, 2 and 10)."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

PACKAGE = Path(__file__).resolve().parents[1] / "cdlm"


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_layers_only_point_down():
    """cli > run > ... > sampling > samplers > guidance/regions > processes > denoiser/...:
    the contracts in pyproject.toml (and cli modules never import one another)."""
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


def test_no_function_is_over_80_lines():
    long = {
        f"{p.relative_to(PACKAGE)}:{node.name}": node.end_lineno - node.lineno + 1
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 80
    }
    assert not long, f"split these: {long}"


def test_cli_is_thin():
    """Entry points parse, check and print; the work lives in the library (issue 22)."""
    lines = sum(
        len(p.read_text(encoding="utf-8").splitlines()) for p in (PACKAGE / "cli").glob("*.py")
    )
    commands = len(
        tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]["scripts"]
    )
    assert lines < 150 * commands, f"cdlm/cli/ has {lines} lines for {commands} commands"


def test_no_process_kind_chains():
    """Callers ask a process what it can do (its capabilities), never which kind it is."""
    hits = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in PACKAGE.rglob("*.py")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"kind\s*[!=]=", line)
    ]
    assert not hits, hits
