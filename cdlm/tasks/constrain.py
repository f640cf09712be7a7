"""``task=constrain``: completions of held-out passages that must meet a checkable constraint.

Every process meets a constraint the same way, through a template (fixed tokens and blanks), so
what is compared is what the model writes around what is fixed. Each kind builds its case from a
passage, or skips a passage that offers none:
- ``contain``: two words of the passage's second half kept at their places, the rest after the
  first third blank. Met by construction (the words are placed); its figure is the gen-PPL.
- ``end_with``: the blank runs up to a fixed sentence-final word (``... W.``); accepted when the
  fill is one sentence running into it (no sentence end inside: a fill that closes its sentence
  early leaves ``W.`` a fragment).
- ``sentences``: a blank of whole sentences after the prompt; accepted with as many sentence
  ends as the original, the last one at the blank's end.
- ``name_twice``: both places of a name the passage uses twice blanked: accepted when both are
  filled with the same capitalised word (joint consistency, decided at both places).
- ``code_line`` (code): one statement line blanked: accepted when it parses (``ast.parse``).
- ``code_name`` (code): both places of an identifier blanked: accepted when both hold the same
  identifier.
A row reports ``acceptance``, ``matches_original`` (the fill is the original's tokens) and, with
a scorer, the perplexity of the accepted passages (``accepted_ppl``).
"""

from __future__ import annotations

from collections.abc import Callable

from cdlm.evaluation.quality import Scorer, generative_perplexity
from cdlm.generation import Plan
from cdlm.generation.inputs import fill_id
from cdlm.model_file import Model
from cdlm.rng import member_seed
from cdlm.tasks.constraint_kinds import BUILD, KINDS, TEXT_KINDS, Case, accepted, same
from cdlm.tasks.passages import Passage
from cdlm.tasks.runs import canvas, run_cases


def make_cases(passages: list[Passage], kind: str, tok) -> list[Case]:
    """The kind's case of each passage that has one its own text passes (so an oracle that
    writes the original is always accepted)."""
    if kind not in BUILD:
        raise ValueError(f"unknown constraint kind {kind!r}; choose from {KINDS}")
    cases = [c for c in map(BUILD[kind], passages) if c is not None]
    return [c for c in cases if accepted(c, c.passage.ids, tok)]


def run(
    model: Model,
    sampler: Callable,
    passages: list[Passage],
    *,
    steps: int,
    seed: int,
    scorer: Scorer | None,
    kinds: list[str] = TEXT_KINDS,
) -> list[dict]:
    """One row per constraint kind with at least one case among the passages."""
    tok = model.tokenizer
    fill, rows = fill_id(tok), []
    for kind in kinds:
        cases = make_cases(passages, kind, tok)
        if not cases:
            continue
        plans = []
        for i, c in enumerate(cases):
            n = c.length()
            layout = canvas(c.passage.ids[:n], c.editable(), fill)
            plans.append(Plan(1, n, steps, member_seed(seed, i), layout=layout, cut_at_eos=False))
        runs = run_cases(model, sampler, plans)
        outputs = [g.samples[0].token_ids for g in runs.generations]
        ok = [accepted(c, ids, tok) for c, ids in zip(cases, outputs, strict=True)]
        original = [
            all(same(c, ids, w) for w in c.blank) for c, ids in zip(cases, outputs, strict=True)
        ]
        row = {
            "kind": kind,
            "cases": len(cases),
            "acceptance": sum(ok) / len(cases),
            "matches_original": sum(original) / len(cases),
        }
        texts = [
            tok.decode(ids, skip_special_tokens=True)
            for ids, good in zip(outputs, ok, strict=True)
            if good
        ]
        if scorer is not None and texts:
            row["accepted_ppl"] = generative_perplexity(texts, scorer).ppl
        rows.append(row | runs.work())
    if not rows:
        raise ValueError(
            f"no passage offers a case of {list(kinds)}: the passages are too short (at most "
            f"{max(len(p.ids) for p in passages)} tokens) or hold no such words"
        )
    return rows
