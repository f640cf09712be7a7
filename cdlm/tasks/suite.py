"""A task's report: its rows (task x process x sampler and the task's parameter), each with the
task's figures and the work and wall time of its runs, and what a reader needs to compare
reports: the tokenizer, the passages' lengths, the model's load time kept apart from the runs."""

from __future__ import annotations

from collections.abc import Callable

from cdlm.evaluation.quality import Scorer
from cdlm.evaluation.speed import spread
from cdlm.model_file import Model
from cdlm.processes import fim
from cdlm.samplers.base import sampler_name
from cdlm.tasks.passages import held_out

TASKS = ("infill", "correct", "write")


def process_label(model: Model) -> str:
    """The process's kind, marked ``+fim`` for an AR model trained to fill in the middle."""
    kind = model.process.kind
    return f"{kind}+fim" if getattr(model.process, "fim", None) is not None else kind


def report(
    name: str,
    task: Callable,
    model: Model,
    sampler: Callable,
    *,
    steps: int,
    seed: int,
    cases: int,
    scorer: Scorer | None,
    data_path: str | None = None,
    val_fraction: float = 0.02,
    load_seconds: float | None = None,
) -> dict:
    """Runs ``task`` (a task module's ``run``, options bound) on ``cases`` held-out passages.
    Passages hold at most the model's length less the 4 FIM sentinels, so that every process
    gets the same passages from the same split and seed."""
    length = model.config["seq_len"] - fim.SENTINELS
    passages = held_out(model, cases, length, seed, data_path, val_fraction)
    rows = task(model, sampler, passages, steps=steps, seed=seed, scorer=scorer)
    label, used = process_label(model), sampler_name(sampler)
    tok = model.tokenizer
    return {
        "task": name,
        "process": label,
        "sampler": used,
        "steps": steps,
        "seed": seed,
        "tokenizer": {"class": type(tok).__name__, "vocab": len(tok)},
        "passage_tokens": spread([len(p.ids) for p in passages]),
        "scorer": None if scorer is None else scorer.name,
        "load_s": load_seconds,
        "rows": [{"task": name, "process": label, "sampler": used} | row for row in rows],
    }
