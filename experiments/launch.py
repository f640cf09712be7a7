"""``cdlm-train`` runs for the experiment scripts (``import launch`` from experiments/).

Each run is a child Python process, exactly as from the command line, so that Hydra's global
state and Lightning's seeding never leak from one run into the next or into the script's own
measurements; a failed run raises ``subprocess.CalledProcessError``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass


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
