"""``task=write``: open generation, scored as the report scores it (gen-PPL beside entropy),
with held-out passages of the same length as the reference."""

from __future__ import annotations

from collections.abc import Callable

from cdlm.evaluation.quality import Scorer, generative_perplexity, token_entropy
from cdlm.generation import Plan
from cdlm.model_file import Model
from cdlm.tasks.passages import Passage
from cdlm.tasks.runs import run_cases


def run(
    model: Model,
    sampler: Callable,
    passages: list[Passage],
    *,
    steps: int,
    seed: int,
    scorer: Scorer | None,
    samples: int = 16,
) -> list[dict]:
    """One row: ``samples`` sequences of the model's length drawn in one batch."""
    plan = Plan(samples, model.config["seq_len"], steps, seed)
    runs = run_cases(model, sampler, [plan])
    ids = [s.token_ids for s in runs.generations[0].samples]
    texts = [s.text for s in runs.generations[0].samples]
    row = {
        "samples": samples,
        "entropy": token_entropy(ids),
        "reference_entropy": token_entropy([p.ids for p in passages]),
    }
    if scorer is not None:
        row["gen_ppl"] = generative_perplexity(texts, scorer).ppl
        row["reference_ppl"] = generative_perplexity([p.text for p in passages], scorer).ppl
    return [row | runs.work()]
