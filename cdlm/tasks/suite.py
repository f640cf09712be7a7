"""A task's report: its rows (task x process x sampler and the task's parameter), each with the
task's figures and the work and wall time of its runs, and what a reader needs to compare
reports: the tokenizer, the passages' lengths, the model's load time kept apart from the runs."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from cdlm.evaluation.quality import Scorer, load_scorer
from cdlm.evaluation.speed import spread
from cdlm.model_file import Model, load_model
from cdlm.processes import fim
from cdlm.samplers.base import sampler_name
from cdlm.sampling import choose
from cdlm.tasks import plan
from cdlm.tasks.passages import held_out

TASKS = ("infill", "correct", "constrain", "plan", "write")
OWN_SCORING = ("correct", "plan")  # judged on tokens or by a checker alone: no scorer loaded


def process_label(model: Model) -> str:
    """The process's kind, marked ``+fim`` for an AR model trained to fill in the middle."""
    kind = model.process.kind
    return f"{kind}+fim" if model.process.fim is not None else kind


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
    """Runs ``task`` (a task module's ``run``, options bound) on ``cases`` held-out inputs: the
    plan task's puzzle lines, or else passages of at most the model's length less the 4 FIM
    sentinels, so that every process gets the same passages from the same split and seed."""
    if name == "plan":
        inputs = plan.held_out(model, cases, seed, data_path, val_fraction)
        lengths = [len(p.line) for p in inputs]
    else:
        length = model.config["seq_len"] - fim.SENTINELS
        inputs = held_out(model, cases, length, seed, data_path, val_fraction)
        lengths = [len(p.ids) for p in inputs]
    rows = task(model, sampler, inputs, steps=steps, seed=seed, scorer=scorer)
    label, used = process_label(model), sampler_name(sampler)
    tok = model.tokenizer
    return {
        "task": name,
        "process": label,
        "sampler": used,
        "steps": steps,
        "seed": seed,
        "tokenizer": {"class": type(tok).__name__, "vocab": len(tok)},
        "input_length": spread(lengths),  # tokens of a passage, characters of a puzzle line
        "scorer": None if scorer is None else scorer.name,
        "load_s": load_seconds,
        "rows": [{"task": name, "process": label, "sampler": used} | row for row in rows],
    }


def evaluate(
    ckpt: str,
    name: str,
    task: Callable,
    sampler: Callable | None,
    *,
    steps: int | None,
    seed: int,
    cases: int,
    scorer: str,
    device: torch.device,
    data_path: str | None = None,
    val_fraction: float = 0.02,
) -> dict:
    """``report`` on the model at ``ckpt`` (its load timed apart), with the sampler and steps
    ``cdlm.sampling.choose`` fills in, and the scorer named by ``scorer`` (``default``,
    ``none`` or an HF causal LM; correct and plan load none)."""
    start = time.perf_counter()
    model = load_model(ckpt, device)
    load = time.perf_counter() - start
    choice = choose(model.process, model.config, steps, sampler)
    judge = None
    if scorer != "none" and name not in OWN_SCORING:
        judge = load_scorer(None if scorer == "default" else scorer, device)
    return report(
        name,
        task,
        model,
        choice.sampler,
        steps=choice.steps,
        seed=seed,
        cases=cases,
        scorer=judge,
        data_path=data_path,
        val_fraction=val_fraction,
        load_seconds=load,
    )


def summary_lines(result: dict) -> list[str]:
    """One line per row: its numeric figures."""
    lines = []
    for row in result["rows"]:
        shown = {k: v for k, v in row.items() if isinstance(v, int | float) and v is not None}
        lines.append("cdlm-eval: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
    return lines
