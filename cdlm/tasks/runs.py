"""One task row's runs: a warm-up kept apart, then one timed run per case, summarised as
min / median / max over the cases (never best-of), with the work each did."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cdlm.evaluation.speed import RunStats, spread, timed_run
from cdlm.generation import Generation, Plan
from cdlm.model_file import Model
from cdlm.regions import Layout, Segment


def canvas(ids: list[int], editable: list[bool], fill_id: int) -> Layout:
    """The layout of token ``ids`` whose ``editable`` runs are blanks (each starting from
    ``fill_id``); a task's fixed regions are token spans, so no text is re-tokenised."""
    spans, segments, start = [], [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or editable[i] != editable[start]:
            blank = i - start if editable[start] else None
            segments.append(Segment("", editable[start], blank, start, i))
            spans.append((start, i))
            start = i
    filled = [fill_id if e else t for t, e in zip(ids, editable, strict=True)]
    return Layout(ids=filled, editable=list(editable), spans=spans, segments=segments)


@dataclass
class CaseRuns:
    """Each case's generation and run statistics, and the warm-up's (reported apart)."""

    generations: list[Generation]
    stats: list[RunStats]
    warmup_seconds: float

    def work(self) -> dict:
        """NFE, positions, wall seconds, revision rounds and the time to the first stable token:
        each's median flat (the tables' figures) and min / median / max over the cases."""
        names = ("nfe", "positions", "wall_seconds", "revision_rounds", "first_stable_seconds")
        spreads = {name: spread([getattr(s, name) for s in self.stats]) for name in names}
        flat = {name: (spreads[name] or {}).get("median") for name in names}
        return {
            "nfe": flat["nfe"],
            "positions": flat["positions"],
            "wall_s_median": flat["wall_seconds"],
            "revision_rounds": flat["revision_rounds"],
            "first_stable_s_median": flat["first_stable_seconds"],
            "warmup_s": self.warmup_seconds,
            "spread": spreads,
        }


def run_cases(model: Model, sampler: Callable, plans: list[Plan]) -> CaseRuns:
    """Times every plan (one case each) after one warm-up run of the first."""
    warm, _ = timed_run(model, sampler, plans[0])
    generations, stats = [], []
    for plan in plans:
        gen, run = timed_run(model, sampler, plan)
        generations.append(gen)
        stats.append(run)
    return CaseRuns(generations, stats, warm.wall_seconds)
