"""``task=correct``: held-out passages with a share of their words corrupted (a random word, a
swapped neighbour, a one-letter typo), found and repaired by the model.

Each corruption keeps every word's token count, so the corrupted passage lies on the original's
canvas and a word is judged on its own token span: restored when its tokens are the original's
again, changed when a correct word's are not. The repair runs ``rounds`` rounds of: score every
word with the word hidden (its tokens' mean log-probability given the rest: masked and block
models read it with the word masked, gaussian models with the word at pure noise and the rest
nearly clean (one noise level per token, as their recipe trains), an AR model trained to fill in
the middle with the word as the middle of a FIM prompt), refill the words scoring below
``log(threshold)`` with the sampler, both sides given, and keep a refill only where the model
scores it ``margin`` nats above the word it replaces. The acceptance check of a passage: every corrupted word restored and
no correct word changed; the seeds' warning holds that a fix that rewrites correct text fails.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cdlm.evaluation.speed import RunStats, timed_run
from cdlm.model_file import Model
from cdlm.sampling import Plan
from cdlm.sampling.inputs import fill_id
from cdlm.tasks.passages import Passage, lay_out, word_ids
from cdlm.tasks.runs import CaseRuns, canvas

RATES = (0.05, 0.15)
KINDS = ("random", "swap", "typo")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Case:
    original: Passage
    corrupted: Passage  # the same token count word by word
    wrong: frozenset[int]  # the corrupted words' indices


def _same_size(tok, old: str, new: str) -> bool:
    return new != old and len(word_ids(tok, new)) == len(word_ids(tok, old))


def _variant(tok, word: str, how: str, pool: list[str], rng: random.Random) -> str | None:
    """A corrupted ``word`` (leading whitespace kept) of the same token count, or None."""
    space, core = word[: len(word) - len(word.lstrip())], word.lstrip()
    for _ in range(20):
        if how == "typo":
            letters = [i for i, ch in enumerate(core) if ch.isalpha()]
            i = rng.choice(letters)
            new = core[:i] + rng.choice(LETTERS.replace(core[i].lower(), "")) + core[i + 1 :]
        else:
            new = rng.choice(pool)
        if _same_size(tok, word, space + new):
            return space + new
    return None


def corrupt(tok, passage: Passage, rate: float, pool: list[str], rng: random.Random) -> Case:
    """``round(rate * words)`` words corrupted (a swap corrupts two), the kinds in turn; a
    word with no same-size variant in 20 tries is left alone."""
    words = list(passage.words)
    eligible = [i for i, w in enumerate(words) if any(ch.isalpha() for ch in w)]
    target, wrong = round(rate * len(words)), set()
    rng.shuffle(eligible)
    for i in eligible:
        if len(wrong) >= target:
            break
        if i in wrong:
            continue
        how = KINDS[len(wrong) % len(KINDS)]
        if how == "swap" and i + 1 in eligible and i + 1 not in wrong and len(wrong) + 2 <= target:
            a, b = words[i], words[i + 1]
            left, right = a[: len(a) - len(a.lstrip())], b[: len(b) - len(b.lstrip())]
            swapped = [left + b.lstrip(), right + a.lstrip()]
            size = sum(len(word_ids(tok, w)) for w in (a, b))
            if a.lstrip() != b.lstrip() and sum(len(word_ids(tok, w)) for w in swapped) == size:
                words[i : i + 2] = swapped
                wrong |= {i, i + 1}
                continue
        new = _variant(tok, words[i], "random" if how == "swap" else how, pool, rng)
        if new is not None:
            words[i] = new
            wrong.add(i)
    return Case(passage, lay_out(tok, words), frozenset(wrong))


@dataclass(frozen=True)
class Check:
    restored: int  # corrupted words whose tokens are the original's again
    changed: int  # correct words whose tokens changed
    wrong: int
    right: int

    @property
    def accepted(self) -> bool:
        return self.restored == self.wrong and self.changed == 0


def check(case: Case, ids: list[int]) -> Check:
    truth, restored, changed = case.original.ids, 0, 0
    for w, (a, b) in enumerate(case.original.spans):
        same = ids[a:b] == truth[a:b]
        if w in case.wrong:
            restored += same
        else:
            changed += not same
    wrong = len(case.wrong)
    return Check(restored, changed, wrong, len(case.original.spans) - wrong)


@torch.no_grad()
def word_scores(model: Model, ids: list[int], spans: list[tuple[int, int]]) -> torch.Tensor:
    """(W,) each word's tokens' mean log-probability with the word hidden, one batch row per
    word (W network evaluations of the canvas)."""
    device = next(model.network.parameters()).device
    x = torch.tensor(ids, device=device).expand(len(spans), -1).clone()
    hidden = torch.zeros_like(x, dtype=torch.bool)
    for w, (a, b) in enumerate(spans):
        hidden[w, a:b] = True
    return model.process.score_hidden(model.denoiser, x, hidden)


def repair(
    model: Model,
    sampler: Callable,
    case: Case,
    *,
    steps: int,
    seed: int,
    threshold: float,
    rounds: int,
    margin: float,
) -> tuple[list[int], RunStats]:
    """The repaired canvas and its work: scoring evaluations and the refills' own, summed.
    A refill is kept only where it beats the word it replaces by ``margin`` nats of mean token
    log-probability (both scored with the word hidden, after the refill): the model must prefer
    its own word clearly, not merely find the user's unlikely."""
    ids, spans = list(case.corrupted.ids), case.corrupted.spans
    fill = fill_id(model.tokenizer)
    nfe = positions = revised = 0
    causal = model.process.causal
    width = len(ids) + (3 if causal else 0)  # a scored row's positions (AR: FIM sentinels, BOS)
    start = time.perf_counter()
    for r in range(rounds):
        scores = word_scores(model, ids, spans)
        nfe += len(spans)
        positions += len(spans) * width
        suspects = [w for w, s in enumerate(scores.tolist()) if s < math.log(threshold)]
        if not suspects:
            break
        editable = [False] * len(ids)
        for w in suspects:
            a, b = spans[w]
            editable[a:b] = [True] * (b - a)
        plan = Plan(
            1, len(ids), steps, seed + r, layout=canvas(ids, editable, fill), cut_at_eos=False
        )
        gen, run = timed_run(model, sampler, plan)
        nfe, positions = nfe + run.nfe, positions + run.positions
        new = gen.samples[0].token_ids
        gains = word_scores(model, new, [spans[w] for w in suspects]) - scores[suspects]
        nfe += len(suspects)
        positions += len(suspects) * width
        for w, gain in zip(suspects, gains.tolist(), strict=True):
            if gain < margin:  # not clearly better: the user's word stays
                a, b = spans[w]
                new[a:b] = ids[a:b]
        revised += new != ids
        if new == ids:
            break
        ids = new
    wall = time.perf_counter() - start
    changed = sum(x != y for x, y in zip(ids, case.corrupted.ids, strict=True))
    return ids, RunStats(wall, nfe, positions, changed, changed / wall, revised, None, None)


def run(
    model: Model,
    sampler: Callable,
    passages: list[Passage],
    *,
    steps: int,
    seed: int,
    scorer=None,
    rates: list[float] = RATES,
    threshold: float = 0.01,
    rounds: int = 2,
    margin: float = 2.0,
) -> list[dict]:
    """One row per corruption rate."""
    tok = model.tokenizer
    pool = sorted({w.strip() for p in passages for w in p.words if w.strip().isalpha()})
    rows = []
    for rate in rates:
        rng = random.Random(seed * 7919 + round(rate * 1000))
        cases = [corrupt(tok, p, rate, pool, rng) for p in passages]
        options = {"steps": steps, "seed": seed, "threshold": threshold, "rounds": rounds}
        options["margin"] = margin
        warm = time.perf_counter()
        repair(model, sampler, cases[0], **options)
        warm = time.perf_counter() - warm
        done = [repair(model, sampler, c, **options) for c in cases]
        checks = [check(c, ids) for c, (ids, _) in zip(cases, done, strict=True)]
        wrong, right = sum(c.wrong for c in checks), sum(c.right for c in checks)
        row = {
            "rate": rate,
            "cases": len(cases),
            "corrupted_words": wrong,
            "restored": sum(c.restored for c in checks) / max(wrong, 1),
            "changed_correct": sum(c.changed for c in checks) / max(right, 1),
            "acceptance": sum(c.accepted for c in checks) / len(cases),
            "threshold": threshold,
            "margin": margin,
            "rounds": rounds,
        }
        rows.append(row | CaseRuns([], [stats for _, stats in done], warm).work())
    return rows
