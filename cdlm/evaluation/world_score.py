"""Exact scoring (``cdlm-eval scorer=world``): samples judged by the world that made the data.

Gen-PPL asks a second model, which has its own habits; an exact world (``cdlm.worlds``) knows the
true likelihood of every sequence, so a sample set can be scored against the truth itself:

- the mean NLL under the world, per token, beside the entropy rate. It is two-sided: exact
  samples average the entropy rate; below it the samples are too likely (collapse onto the
  modes), above it they wander where the world rarely goes;
- Tang et al.'s transition-level KL and TV rates (ICML 2026, "Is Your Diffusion Sampler
  Actually Correct?"; LuhanTang/dllm_sampler, ``sampler/metrics_full.py``): the empirical
  next-token distribution of each token against the world's. These plug-in estimates are biased
  upward (a finite sample never matches a distribution exactly), so each comes with its floor:
  the same estimator on as many exact samples of the same length;
- the share of samples the world gives probability 0 (violations), and of the constraints it
  imposes that they break (``World.constraint_rate``);
- distinct-2/3, as for every scorer.

A model's bound on exact samples minus the entropy rate is its excess bits (``harness``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from cdlm import worlds
from cdlm.evaluation.bound import val_bits_per_token
from cdlm.evaluation.quality import distinct_n, diversity
from cdlm.model_file import Model
from cdlm.processes import fim
from cdlm.rng import generator
from cdlm.worlds import PREFIX, World, is_world, names
from cdlm.worlds.reference import TransitionReference, as_reference

LN2 = math.log(2)


class TransitionRates(NamedTuple):
    """kl: nats per transition; tv: total variation, in [0, 1]."""

    kl: float
    tv: float


def transition_rates(tokens: Tensor, reference: TransitionReference | Tensor) -> TransitionRates:
    """Tang et al.'s transition-level KL and TV rates of a sample set.

    Over all M = N (T - 1) consecutive pairs (a, b) of ``tokens`` (N, T): w_a is the share of
    pairs that start with a and p(b | a) the empirical next-token distribution;
    KL = sum_a w_a KL(p(. | a) || q(. | a)) (+inf where a pair the world never makes occurs) and
    TV = sum_a w_a 1/2 sum_b |p(b | a) - q(b | a)| over every b, seen or not.

    Args:
        tokens: (N, T) token ids, each < V.
        reference: q(b | a), the world's ``transition_reference`` (``cdlm.worlds.reference``:
            a chain's own sparse transition), or a (V, V) table (float64 is kept).

    Only the pairs that occur are read (a row's unseen successors enter TV through its total,
    1 for a row the world visits and 0 otherwise), so a large vocabulary costs no (V, V) table.
    NaN for T < 2.
    """
    reference = as_reference(reference)
    v = reference.vocab_size
    prev, succ = tokens[:, :-1].reshape(-1).cpu().long(), tokens[:, 1:].reshape(-1).cpu().long()
    m = prev.numel()
    if m == 0:
        return TransitionRates(math.nan, math.nan)
    pairs, counts = torch.unique(prev * v + succ, return_counts=True)
    a, b = pairs // v, pairs % v
    counts = counts.double()
    row_counts = torch.zeros(v, dtype=torch.float64).index_add_(0, a, counts)
    p = counts / row_counts[a]
    q = reference.prob(a, b)
    kl = float((counts / m * (p.log() - q.log())).sum())
    seen = torch.unique(a)
    # sum_b |p - q| = sum over seen b of |p - q| + the mass q puts on the unseen successors
    seen_gap = torch.zeros(v, dtype=torch.float64).index_add_(0, a, (p - q).abs())
    seen_mass = torch.zeros(v, dtype=torch.float64).index_add_(0, a, q)
    visited = reference.visited(seen)  # q(. | a) sums to 1; a row never visited is all 0
    unseen = torch.where(visited, 1.0 - seen_mass[seen], 1.0).clamp_min(0)
    tv = float((row_counts[seen] / m * 0.5 * (seen_gap[seen] + unseen)).sum())
    return TransitionRates(kl, tv)


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (NaN for fewer than two values)."""
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((x - mean) ** 2 for x in values) / (k - 1) / k)


def rate_figures(rates, possible, floors: list) -> dict:
    """The transition KL (bits) and TV rates of a sample set beside their floor, the same
    estimate on exact sample sets (mean and SE over ``floors``), and over its ``possible``
    samples alone (None: none was)."""
    kl_floor, kl_floor_se = _mean_se([f.kl for f in floors])
    tv_floor, tv_floor_se = _mean_se([f.tv for f in floors])
    return {
        "kl_rate": rates.kl / LN2,
        "kl_floor": kl_floor / LN2,
        "kl_floor_se": kl_floor_se / LN2,
        "tv_rate": rates.tv,
        "tv_floor": tv_floor,
        "tv_floor_se": tv_floor_se,
        "kl_rate_possible": possible.kl / LN2 if possible else math.nan,
        "tv_rate_possible": possible.tv if possible else math.nan,
    }


def score_samples(
    world: World,
    tokens: Tensor,
    *,
    floor_repeats: int = 8,
    generator: torch.Generator | None = None,
    reference: TransitionReference | Tensor | None = None,
) -> dict[str, float]:
    """The world's scores of a sample set ``tokens`` (N, L), token ids of the world's tokenizer.

    Keys (bits are log base 2):
        samples, length: N and L.
        nll_truth, nll_truth_se: mean NLL per token under the world in bits/token, and its
            standard error over samples, over the samples the world can make (NaN if none).
        entropy_rate: bits/token at length L: what exact samples average.
        kl_rate, kl_floor, kl_floor_se: transition KL rate in bits per transition; its floor,
            the mean over ``floor_repeats`` sets of N exact samples of length L, and the floor's
            standard error. Over all samples: +inf once a pair the world never makes occurs.
        tv_rate, tv_floor, tv_floor_se: the transition TV rate, unitless in [0, 1], likewise.
        kl_rate_possible, tv_rate_possible: the two rates over the samples the world can make
            (NaN if none): a learned model's rare impossible pair makes ``kl_rate`` infinite,
            which says nothing of the rest; ``violation_rate`` counts the impossible apart.
        violation_rate: the share of samples with probability 0.
        constraint_rate: the mean share of the world's constraints a sample breaks
            (``World.constraint_rate``; for a world without others, the violation rate).
        distinct_2, distinct_3: distinct n-grams over all n-grams (``quality.distinct_n``).

    ``generator`` draws the floor's exact samples; ``reference`` is the world's
    ``transition_reference(L)`` when the caller has it already (a world that is not a chain
    builds a (V, V) table for it).
    """
    if tokens.ndim != 2 or tokens.numel() == 0:
        raise ValueError(f"score_samples needs (N, L) tokens, got shape {tuple(tokens.shape)}")
    if int(tokens.max()) >= world.vocab_size or int(tokens.min()) < 0:
        raise ValueError(f"token ids outside world {world.name}'s vocabulary ({world.vocab_size})")
    n, length = tokens.shape
    reference = world.transition_reference(length) if reference is None else reference
    log_p = world.log_prob(tokens)
    finite = torch.isfinite(log_p)
    nll = -log_p[finite] / length / LN2
    nll_truth, nll_se = _mean_se(nll.tolist()) if nll.numel() else (math.nan, math.nan)
    rates = transition_rates(tokens, reference)
    possible = transition_rates(tokens[finite], reference) if finite.any() else None
    floors = [
        transition_rates(world.sample(n, length, generator=generator), reference)
        for _ in range(floor_repeats)
    ]
    rows = tokens.tolist()
    return {
        "samples": n,
        "length": length,
        "nll_truth": nll_truth,
        "nll_truth_se": nll_se,
        "entropy_rate": world.entropy_rate(length) / LN2,
        **rate_figures(rates, possible, floors),
        "violation_rate": float(torch.isinf(log_p).double().mean()),
        "constraint_rate": float(world.constraint_rate(tokens).mean()),
        "distinct_2": distinct_n(rows, 2),
        "distinct_3": distinct_n(rows, 3),
    }


def finite_row(row: dict) -> dict:
    """``row`` with each infinite or NaN number as None, its key named in ``infinite`` (with
    any named before): JSON has no Infinity, and a KL rate is infinite where samples fall where
    the truth puts no mass."""
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    return row | dict.fromkeys(bad) | {"infinite": [*row.get("infinite", []), *bad]}


def world_spec(scorer: str, config: dict) -> str | None:
    """The world a ``scorer=`` value names: ``world:<name>`` itself, ``world`` the model's own
    (``config["world"]``, which world models and models trained on world data record); None for
    any other scorer."""
    if scorer != "world" and not is_world(scorer):
        return None
    spec = scorer if is_world(scorer) else config.get("world")
    if not spec:
        raise ValueError(
            "scorer=world scores a model by the world it was trained on, and this model records "
            f"none; name one: scorer=world:<name> ({', '.join(names())})"
        )
    name = str(spec)[len(PREFIX) :] if is_world(str(spec)) else str(spec)
    if name not in names():
        raise ValueError(f"unknown world {spec!r}; valid: {', '.join(names())} (conf/world/)")
    return PREFIX + name


def canvas(token_lists: list[list[int]], length: int, fill: int) -> Tensor:
    """(N, length) samples as a world reads them: a sample cut short (at its EOS) is filled
    with ``fill`` (EOS, which no world emits), so it counts as the violation it is."""
    return torch.tensor([ids[:length] + [fill] * (length - len(ids)) for ids in token_lists])


def world_quality(
    world: World,
    spec: str,
    tokens: Tensor,
    *,
    generator: torch.Generator | None = None,
    floor_repeats: int = 8,
) -> dict:
    """A report's quality section under a world: the samples' scores and diversity beside those
    of as many exact samples of the same length (``reference``)."""
    n, length = tokens.shape
    reference = world.transition_reference(length)
    exact = world.sample(n, length, generator=generator)
    scored = {}
    for side, rows in (("samples", tokens), ("reference", exact)):
        scores = score_samples(
            world, rows, floor_repeats=floor_repeats, generator=generator, reference=reference
        )
        scored[side] = diversity(rows.tolist()) | scores
    return {"scorer": spec, "scorer_is_base": False, "world": world.describe(), **scored}


WORLD_SEQUENCES = 256  # exact samples the bound is taken on when no count is given


def world_of(model: Model, spec: str) -> worlds.World:
    """The world ``spec`` that is to score ``model``'s samples, refused unless its vocabulary is
    the model's (a model judged by another world's ids would be scored as noise), bar the FIM
    sentinels of an AR-FIM model."""
    own = spec == model.config.get("world")  # built with the options it records
    world = worlds.recorded(model.config) if own else worlds.load(spec)
    if not world.speaks(model.tokenizer, extra=fim.TOKENS):  # an AR-FIM model adds sentinels
        raise ValueError(
            f"the model's vocabulary is not {spec}'s; scorer=world:<name> names the world the "
            "model was trained on (scorer=world: the one it records)"
        )
    return world


def world_sections(
    model: Model,
    world: worlds.World,
    spec: str,
    samples,
    seed: int,
    sequences: int | None,
    draws: int,
) -> tuple[dict, dict]:
    """``scorer=world``: the quality section (``world_score.world_quality``: the whole canvases
    of the samples scored by the world ``spec``, beside exact samples), and the likelihood
    section: the model's bound on ``sequences`` exact samples (the bundled corpus is not the
    world's), its entropy rate, and the difference, the model's excess bits per token; beside
    them the world's own NLL of those very sequences (bound minus it: the same excess without
    the sampling noise of the set, a paired estimate)."""
    length = model.config["seq_len"]
    stream = generator(seed)  # one stream: floors, reference and bound sets all differ
    tokens = canvas([s.token_ids for s in samples], length, world.tokenizer.eos_token_id)
    quality = world_quality(world, spec, tokens, generator=stream)
    exact = world.sample(sequences or WORLD_SEQUENCES, length, generator=stream)
    bound = val_bits_per_token(model, exact, seed, draws=draws)
    rate = world.entropy_rate(length) / LN2
    return quality, bound | {
        "data": f"{len(exact)} exact {spec} samples",
        "entropy_rate_bits": rate,
        "exact_nll_bits": float(-world.log_prob(exact).mean()) / length / LN2,
        "excess_bits": bound["bits_per_token"] - rate,
    }
