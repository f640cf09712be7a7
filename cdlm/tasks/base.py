"""What a task is: its name, the reader of its inputs, and its run, whose one signature
``TaskRun`` writes down (k-diffusion's one sampler signature, for tasks).

``conf/task/<name>.yaml`` builds a ``Task`` (``cdlm-eval task=<name>``): the task's options sit
beside ``run`` and ``read`` (``task.spans=...``) and are bound to ``run``. A new task is a module
with a ``run`` of this signature, a reader (``cdlm.tasks.readers``) and its yaml, plus a row in
tests/test_task_contract.py, which fails for a task config without one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.evaluation.quality import Scorer
from cdlm.model_file import Model


@dataclass(frozen=True)
class Inputs:
    """A task's held-out inputs (passages, puzzles) and each one's length as reported."""

    items: list
    lengths: list[int]


class Reader(Protocol):
    """``cases`` held-out inputs chosen by ``seed`` from the split of the corpus at
    ``data_path`` that training held out (``val_fraction``)."""

    def __call__(
        self, model: Model, cases: int, seed: int, data_path: str | None, val_fraction: float, /
    ) -> Inputs: ...


class TaskRun(Protocol):
    """A task's rows on ``inputs`` (its reader's items, named as the task likes: passages,
    puzzles), each row a dict of the task's figures and its runs' work (``CaseRuns.work``);
    ``scorer`` is None when none was loaded. A task's own options follow, with defaults."""

    def __call__(
        self,
        model: Model,
        sampler: Callable,
        inputs: list,
        /,
        *,
        steps: int,
        seed: int,
        scorer: Scorer | None,
    ) -> list[dict]: ...


class Task:
    """A task as its config builds it: ``run`` with the task's ``options`` bound, still a
    ``TaskRun``; ``scored``: whether it uses a gen-PPL scorer (a task judged on tokens or by a
    checker alone gets none, so none is loaded)."""

    def __init__(
        self, name: str, run: TaskRun, read: Reader, scored: bool = True, **options: Any
    ) -> None:
        self.name, self.read, self.scored, self.options = name, read, scored, options
        self.run: TaskRun = functools.partial(run, **options)


def named_task(name: str, **options: Any) -> Task:
    """The task of ``conf/task/<name>.yaml``, its options merged with ``options``."""
    path = config_dir() / "task" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(known)}")
    return instantiate(OmegaConf.merge(OmegaConf.load(path), options))
