"""``task=infill``: a middle span of a held-out passage removed, both sides given.

The acceptance check is exact recovery of the span. A row reports token accuracy, span exact
match, whether the fixed regions came back unchanged (they must), and with a scorer the
perplexity of the filled passages against the originals'. In an exact world the passages are the
world's samples and a row also reports the ceiling its exact conditional sets (``exact_figures``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cdlm import worlds
from cdlm.evaluation.quality import Scorer, generative_perplexity
from cdlm.evaluation.world_conditional import infill_ceiling
from cdlm.evaluation.world_score import _mean_se
from cdlm.generation import Plan
from cdlm.generation.inputs import fill_id
from cdlm.model_file import Model
from cdlm.regions import Layout
from cdlm.rng import member_seed
from cdlm.tasks.passages import Passage
from cdlm.tasks.runs import canvas, run_cases
from cdlm.worlds.conditional import condition

SPANS = (1, 4, 16, 32)
MARGIN = 4  # tokens of context each side at least


@dataclass(frozen=True)
class Case:
    passage: Passage
    start: int
    span: int

    def editable(self) -> list[bool]:
        return [self.start <= i < self.start + self.span for i in range(len(self.passage.ids))]

    def layout(self, fill_id: int) -> Layout:
        return canvas(self.passage.ids, self.editable(), fill_id)


@dataclass(frozen=True)
class Check:
    correct: int  # span tokens recovered
    exact: bool  # the whole span recovered: the acceptance check
    intact: bool  # every fixed token unchanged


def check(case: Case, ids: list[int]) -> Check:
    truth, gap = case.passage.ids, range(case.start, case.start + case.span)
    correct = sum(ids[i] == truth[i] for i in gap)
    intact = all(ids[i] == truth[i] for i in range(len(truth)) if i not in gap)
    return Check(correct, correct == case.span, intact)


def make_cases(passages: list[Passage], span: int, seed: int) -> list[Case]:
    """One case per passage long enough for ``span`` and a margin each side; the span's start is
    drawn uniformly from the middle half of the room (seeded by ``seed`` and ``span``)."""
    g = torch.Generator().manual_seed(seed * 1009 + span)
    cases = []
    for p in passages:
        room = len(p.ids) - span
        if room < 2 * MARGIN:
            continue
        low = max(MARGIN, room // 4)
        high = max(low, room - max(MARGIN, room // 4))
        cases.append(Case(p, int(torch.randint(low, high + 1, (1,), generator=g)), span))
    if not cases:
        raise ValueError(f"no passage is long enough for an infill span of {span} tokens")
    return cases


def run(
    model: Model,
    sampler: Callable,
    passages: list[Passage],
    *,
    steps: int,
    seed: int,
    scorer: Scorer | None,
    spans: list[int] = SPANS,
) -> list[dict]:
    """One row per span length."""
    tok = model.tokenizer
    fill = fill_id(tok)
    rows = []
    for span in spans:
        cases = make_cases(passages, span, seed)
        plans = [
            Plan(
                1,
                len(c.passage.ids),
                steps,
                member_seed(seed, i),
                layout=c.layout(fill),
                cut_at_eos=False,
            )
            for i, c in enumerate(cases)
        ]
        runs = run_cases(model, sampler, plans)
        outputs = [g.samples[0].token_ids for g in runs.generations]
        checks = [check(c, ids) for c, ids in zip(cases, outputs, strict=True)]
        row = {
            "span": span,
            "cases": len(cases),
            "token_accuracy": sum(c.correct for c in checks) / (span * len(cases)),
            "span_exact": sum(c.exact for c in checks) / len(cases),
            "fixed_intact": sum(c.intact for c in checks) / len(cases),
        }
        if scorer is not None:
            texts = [tok.decode(ids, skip_special_tokens=True) for ids in outputs]
            truth = [tok.decode(c.passage.ids, skip_special_tokens=True) for c in cases]
            filled = generative_perplexity(texts, scorer).ppl
            original = generative_perplexity(truth, scorer).ppl
            row |= {"scorer_ppl": filled, "original_ppl": original, "ppl_ratio": filled / original}
        if cases[0].passage.world is not None:
            row |= exact_figures(cases, checks)
        rows.append(row | runs.work())
    return rows


def exact_figures(cases: list[Case], checks: list[Check]) -> dict:
    """In a world (passages its exact samples): the standard errors of token accuracy and span
    exact-match over the cases, and beside them what the world's exact conditional of each
    case's span given its two sides allows (``infill_ceiling``, averaged over the cases): an
    exact sampler's expected figures and the best token accuracy of any infill."""
    world = worlds.load(cases[0].passage.world)
    ceilings = [
        infill_ceiling(condition(world, torch.tensor(c.passage.ids), torch.tensor(c.editable())))
        for c in cases
    ]
    accuracy = [k.correct / c.span for c, k in zip(cases, checks, strict=True)]
    out = {
        "token_accuracy_se": _mean_se(accuracy)[1],
        "span_exact_se": _mean_se([float(k.exact) for k in checks])[1],
    }
    return out | {k: sum(c[k] for c in ceilings) / len(ceilings) for k in ceilings[0]}
