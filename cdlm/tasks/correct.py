"""``task=correct``: held-out passages with a share of their words corrupted (a random word, a
swapped neighbour, a one-letter typo), found and repaired by the model.

Each corruption keeps every word's token count, so the corrupted passage lies on the original's
canvas and a word is judged on its own token span: restored when its tokens are the original's
again, changed when a correct word's are not. The repair runs ``rounds`` rounds of:

- score every word with the word hidden (its tokens' mean log-probability given the rest, the
  process's ``score_hidden``), one row per word, ``batch`` rows per network call;
- take the ``suspects`` share of the passage's words that score lowest (ranked within the
  passage: a weak model scores nearly every word below any absolute threshold, which refilled
  63-74% of correct words under the old ``log(threshold)`` rule, issue 42);
- refill them with the sampler, both sides given, in as many steps as they have tokens (a token
  process decides at least one a step) rather than full-canvas steps;
- keep a refill only where, scored in the same canvas as the user's word (the word hidden, every
  other word as the user's text stands), it beats the user's word by ``margin`` nats.

The acceptance check of a passage: every corrupted word restored and no correct word changed;
the seeds' warning holds that a fix that rewrites correct text fails.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cdlm.evaluation.speed import RunStats, timed_run
from cdlm.generation import Plan
from cdlm.generation.inputs import fill_id
from cdlm.model_file import Model
from cdlm.progress import progress
from cdlm.rng import member_seed
from cdlm.tasks.passages import Passage, lay_out, word_ids
from cdlm.tasks.runs import CaseRuns, canvas

RATES = (0.05, 0.15)
KINDS = ("random", "swap", "typo")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
BATCH = 32  # scored rows per network call


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
def hidden_scores(
    model: Model, rows: list[list[int]], spans: list[tuple[int, int]], batch: int = BATCH
) -> torch.Tensor:
    """(R,) the mean log-probability of row r's tokens in ``spans[r]``, hidden, given the rest of
    row r: R network evaluations of a canvas, ``batch`` rows per call so that memory (rows x
    length x vocabulary logits) stays bounded however many words a passage has."""
    device = next(model.network.parameters()).device
    out = []
    for i in range(0, len(rows), batch):
        x = torch.tensor(rows[i : i + batch], device=device)
        hidden = torch.zeros_like(x, dtype=torch.bool)
        for r, (a, b) in enumerate(spans[i : i + batch]):
            hidden[r, a:b] = True
        out.append(model.process.score_hidden(model.denoiser, x, hidden).cpu())
    return torch.cat(out) if out else torch.zeros(0)


def word_scores(
    model: Model, ids: list[int], spans: list[tuple[int, int]], batch: int = BATCH
) -> torch.Tensor:
    """(W,) each word's score with the word hidden and the rest of ``ids`` given."""
    return hidden_scores(model, [list(ids)] * len(spans), spans, batch)


def suspects_of(scores: torch.Tensor, share: float) -> list[int]:
    """The ``max(1, round(share * W))`` lowest of the (W,) word ``scores``, in word order.

    Ranked within the passage: the words this model finds least likely here, whatever its
    absolute calibration. ``share`` is the part of the text the user expects wrong; it also
    bounds the correct words a round can touch, which the margin then guards."""
    k = min(len(scores), max(1, round(share * len(scores))))
    return sorted(scores.topk(k, largest=False).indices.tolist())


def refill_steps(model: Model, steps: int, tokens: int) -> int:
    """A token process decides at least one blank a step, so steps beyond the suspects' tokens
    only repeat calls; a continuous process's steps are its integration grid and stay."""
    return steps if model.process.continuous else max(1, min(steps, tokens))


def repair(
    model: Model,
    sampler: Callable,
    case: Case,
    *,
    steps: int,
    seed: int,
    suspects: float,
    rounds: int,
    margin: float,
    batch: int = BATCH,
) -> tuple[list[int], RunStats]:
    """The repaired canvas and its work: scoring evaluations (one per scored row) and the
    refills' own, summed. A refill is kept only where it beats the user's word by ``margin``
    nats of mean token log-probability, both scored in one context: the word hidden and every
    other word as the user's text stands (the user's is the round's own word score). Judging
    the refill in the refilled canvas instead, as before, let a joint refill vouch for itself."""
    ids, spans = list(case.corrupted.ids), case.corrupted.spans
    fill = fill_id(model.tokenizer)
    nfe = positions = revised = 0
    width = len(ids) + (3 if model.process.causal else 0)  # a scored row (AR: FIM sentinels, BOS)
    start = time.perf_counter()
    for r in range(rounds):
        scores = word_scores(model, ids, spans, batch)
        chosen = suspects_of(scores, suspects)
        editable = [False] * len(ids)
        for w in chosen:
            a, b = spans[w]
            editable[a:b] = [True] * (b - a)
        size = refill_steps(model, steps, sum(editable))
        plan = Plan(
            1,
            len(ids),
            size,
            member_seed(seed, r),
            layout=canvas(ids, editable, fill),
            cut_at_eos=False,
        )
        gen, run = timed_run(model, sampler, plan)
        refill = gen.samples[0].token_ids
        trials = [
            ids[: spans[w][0]] + refill[slice(*spans[w])] + ids[spans[w][1] :] for w in chosen
        ]
        mine = hidden_scores(model, trials, [spans[w] for w in chosen], batch)
        nfe += len(spans) + run.nfe + len(chosen)
        positions += (len(spans) + len(chosen)) * width + run.positions
        new = list(ids)
        for w, gain in zip(chosen, (mine - scores[chosen]).tolist(), strict=True):
            if gain >= margin:  # clearly better in the same context: the model's word goes in
                a, b = spans[w]
                new[a:b] = refill[a:b]
        if new == ids:
            break
        revised += 1
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
    suspects: float = 0.05,
    rounds: int = 1,
    margin: float = 2.0,
    batch: int = BATCH,
) -> list[dict]:
    """One row per corruption rate; progress on stderr (a line at most every 30 s, and one when
    a rate's cases are done: scoring every word is slow on a CPU)."""
    tok = model.tokenizer
    pool = sorted({w.strip() for p in passages for w in p.words if w.strip().isalpha()})
    options = {"steps": steps, "seed": seed, "suspects": suspects, "rounds": rounds}
    options |= {"margin": margin, "batch": batch}
    rows = []
    for rate in rates:
        rng = random.Random(seed * 7919 + round(rate * 1000))
        cases = [corrupt(tok, p, rate, pool, rng) for p in passages]
        warm = time.perf_counter()
        repair(model, sampler, cases[0], **options)
        warm = time.perf_counter() - warm
        done = [
            repair(model, sampler, c, **options)
            for c in progress(cases, f"cdlm-eval: correct at rate {rate}, case")
        ]
        checks = [check(c, ids) for c, (ids, _) in zip(cases, done, strict=True)]
        wrong, right = sum(c.wrong for c in checks), sum(c.right for c in checks)
        row = {
            "rate": rate,
            "cases": len(cases),
            "corrupted_words": wrong,
            "restored": sum(c.restored for c in checks) / max(wrong, 1),
            "changed_correct": sum(c.changed for c in checks) / max(right, 1),
            "acceptance": sum(c.accepted for c in checks) / len(cases),
            "suspects": suspects,
            "margin": margin,
            "rounds": rounds,
        }
        rows.append(row | CaseRuns([], [stats for _, stats in done], warm).work())
    return rows
