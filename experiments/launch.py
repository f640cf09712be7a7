"""``cdlm-train`` runs for the experiment scripts (``import launch`` from experiments/).

Each run is a child Python process, exactly as from the command line, so that Hydra's global
state and Lightning's seeding never leak from one run into the next or into the script's own
measurements; a failed run raises ``subprocess.CalledProcessError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrainingRun:
    """What one run cost: ``wall_seconds``, and ``cpu_seconds`` of the child process (user and
    system time, all its threads: the work, whatever else the machine was doing)."""

    wall_seconds: float
    cpu_seconds: float


def train(overrides: list[str], *, wandb: bool = True) -> TrainingRun:
    """``cdlm-train`` with these Hydra ``overrides``; ``wandb=False`` switches W&B off entirely
    (``WANDB_MODE=disabled``) rather than leaving it to the configured logger."""
    env = os.environ if wandb else os.environ | {"WANDB_MODE": "disabled"}
    return run([sys.executable, "-m", "cdlm.cli.train", *overrides], env)


def run(command: list[str], env: Mapping[str, str]) -> TrainingRun:
    """Run ``command`` to its end and read its own cost. ``wait4`` reports that one child's
    resource use; ``os.times`` would also count every other child that ended meanwhile (the
    experiment scripts run two at a time from threads)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    wall = time.perf_counter() - start
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, command)
    return TrainingRun(wall_seconds=wall, cpu_seconds=usage.ru_utime + usage.ru_stime)


def evaluate_children(
    script: Path, specs: list[dict], out_dir: Path, jobs: int, options: list[str]
) -> list[dict]:
    """Every spec's rows, from ``script --evaluate-one SPEC --out OUT/<name>.json *options`` in a
    child process of its own (a model's evaluation never shares torch's state with another's),
    ``jobs`` at a time; a spec whose file exists is read, not evaluated again."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(spec: dict) -> list[dict]:
        path = out_dir / f"{spec['name']}.json"
        if not path.is_file():
            cmd = [sys.executable, str(script), "--evaluate-one", json.dumps(spec)]
            subprocess.run([*cmd, "--out", str(path), *options], check=True)
        return json.loads(path.read_text())

    with ThreadPoolExecutor(jobs) as pool:
        return [row for rows in pool.map(one, specs) for row in rows]
