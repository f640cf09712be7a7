"""The README's two commands are the ones CI runs: .ci/run reads the test command from
README.md (scripts/readme_commands.py) and runs it as written, and the quickstart's training and
sampling run in the slow suite with a short budget."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import experiment_module, run_cli

ROOT = Path(__file__).resolve().parents[1]
readme_commands = experiment_module("readme_commands", "scripts")


def test_ci_runs_the_readmes_test_command_as_written_and_installs_nothing_before_it():
    ci = (ROOT / ".ci/run").read_text()
    run = ci.index('bash -c "$readme"')
    assert "scripts/readme_commands.py test" in ci[:run]
    before = [line for line in ci[:run].splitlines() if not line.lstrip().startswith("#")]
    assert not any(re.search(r"\b(pip|pytest|venv)\b", line) for line in before), before


def test_the_test_command_installs_the_pinned_torch_first_then_runs_pytest():
    test = readme_commands.commands((ROOT / "README.md").read_text())["test"]
    steps = [s.strip() for s in test.split("&&")]
    assert steps[0].startswith("python3 -m venv .venv") and steps[-1] == "python -m pytest"
    torch_at = steps.index("pip install torch==2.13.0")
    assert torch_at < next(i for i, s in enumerate(steps) if ".[dev]" in s)


def test_a_readme_without_both_commands_or_with_a_split_one_is_refused():
    with pytest.raises(ValueError, match="2 fenced bash blocks, found 1"):
        readme_commands.commands("```bash\npip install .\n```\n")
    with pytest.raises(ValueError, match="test command must be one line"):
        readme_commands.commands("```bash\na\n```\n```bash\nb\nc\n```\n")


@pytest.mark.slow
def test_the_quickstart_command_trains_and_samples_on_a_short_budget(tmp_path):
    """The README's quickstart after its install steps, with the wall clock cut to seconds."""
    quick = readme_commands.commands((ROOT / "README.md").read_text())["quickstart"]
    runs = [shlex.split(s) for s in quick.split("&&") if s.strip().startswith("cdlm-")]
    assert [r[0] for r in runs] == ["cdlm-train", "cdlm-sample"]
    budget = ["trainer.max_time=00:00:00:20", "callbacks.samples.every_n_steps=100000",
              "trainer.val_check_interval=1000"]  # fmt: skip
    trained = run_cli(runs[0][0], *runs[0][1:], *budget, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    sampled = run_cli(runs[1][0], *runs[1][1:], "num_samples=1", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert sampled.stdout.strip()
