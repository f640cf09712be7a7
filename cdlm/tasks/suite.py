"""A task's report: its rows (task x process x sampler and the task's parameter), each with the
task's figures and the work and wall time of its runs, and what a reader needs to compare
reports: the tokenizer, the passages' lengths, the model's load time kept apart from the runs."""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from cdlm.evaluation.metric import Loaded, Measured, scorer_of
from cdlm.evaluation.quality import Scorer
from cdlm.evaluation.speed import spread
from cdlm.model_file import Model
from cdlm.samplers.base import sampler_name
from cdlm.tasks.base import Task


def process_label(model: Model) -> str:
    """The process's kind, marked ``+fim`` for an AR model trained to fill in the middle."""
    kind = model.process.kind
    return f"{kind}+fim" if model.process.fim is not None else kind


def report(
    task: Task,
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
    """Runs ``task`` on ``cases`` held-out inputs of its own reader."""
    inputs = task.read(model, cases, seed, data_path, val_fraction)
    rows = task.run(model, sampler, inputs.items, steps=steps, seed=seed, scorer=scorer)
    label, used = process_label(model), sampler_name(sampler)
    tok = model.tokenizer
    return {
        "task": task.name,
        "process": label,
        "sampler": used,
        "steps": steps,
        "seed": seed,
        "tokenizer": {"class": type(tok).__name__, "vocab": len(tok)},
        "input_length": spread(inputs.lengths),  # tokens of a passage, characters of a puzzle
        "scorer": None if scorer is None else scorer.name,
        "load_s": load_seconds,
        "rows": [{"task": task.name, "process": label, "sampler": used} | row for row in rows],
    }


def measure(task: Task, loaded: Loaded, cfg: DictConfig) -> Measured:
    """``cdlm-eval task=<name>`` (bound to its ``task``, the ``Metric`` signature): ``report``
    with the sampler and steps chosen at load, and the scorer named by ``scorer`` when the task
    is ``scored``."""
    scorer = scorer_of(cfg.scorer, loaded.device) if task.scored else None
    result = report(
        task,
        loaded.model,
        loaded.choice.sampler,
        steps=loaded.choice.steps,
        seed=cfg.seed,
        cases=cfg.cases,
        scorer=scorer,
        data_path=cfg.data.path,
        val_fraction=cfg.data.val_fraction,
        load_seconds=loaded.load_seconds,
    )
    return Measured(f"task_{task.name}", result, "\n".join(summary_lines(result)))


def summary_lines(result: dict) -> list[str]:
    """One line per row: its numeric figures."""
    lines = []
    for row in result["rows"]:
        shown = {k: v for k, v in row.items() if isinstance(v, int | float) and v is not None}
        lines.append("cdlm-eval: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
    return lines
