"""Conditional samples scored against the truth: a continuation or an infilled span judged by the
world's exact conditional given the fixed text (``cdlm.worlds.conditional``).

The figures mirror the unconditional ones (``world_score``), with the conditional in place of
the world:

- the transition KL and TV rates of the transitions into free positions, against the
  conditional's own expected pair table (a continuation's first token is read after the
  prompt's last; an infill's span between its two fixed ends), each beside its floor: the same
  plug-in estimator on as many exact conditional samples;
- the NLL per free token under the exact conditional beside the conditional's entropy per free
  token (exact samples average it);
- the share of samples the conditional rules out (``violation_rate``): in the agreement world, a
  span whose name disagrees with a fixed end.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cdlm.evaluation.world_score import LN2, _mean_se, rate_figures, transition_rates
from cdlm.worlds.conditional import Conditional


def free_pairs(tokens: Tensor, free: Tensor) -> Tensor:
    """(N * F, 2) the pairs (x_{i-1}, x_i) of ``tokens`` (N, L) at the F free positions i >= 1
    of ``free`` (L,), as rows of two, the form ``transition_rates`` reads."""
    into = torch.nonzero(free.cpu())[:, 0]
    into = into[into > 0]
    tokens = tokens.cpu()
    return torch.stack([tokens[:, into - 1], tokens[:, into]], -1).reshape(-1, 2)


def score_conditional(
    cond: Conditional,
    tokens: Tensor,
    *,
    floor_repeats: int = 8,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """The exact conditional's scores of a sample set ``tokens`` (N, L) on its canvas.

    Keys (bits are log base 2):
        samples, length, free: N, L and the free positions per sample.
        nll_cond, nll_cond_se: mean -log p(free | fixed) per free token in bits, and its standard
            error over the samples the conditional allows (NaN if none).
        entropy_cond: H(free | fixed) per free token in bits: what exact samples average.
        kl_rate, kl_floor, kl_floor_se: the transition KL rate of the pairs into free positions
            against the conditional's (bits per transition); the floor, the mean over
            ``floor_repeats`` sets of N exact conditional samples, and its standard error.
        tv_rate, tv_floor, tv_floor_se: the transition TV rate, likewise.
        kl_rate_possible, tv_rate_possible: the rates over the samples the conditional allows.
        violation_rate: the share of samples the conditional rules out.
        constraint_rate: the mean share of the world's constraints a whole canvas breaks.
    """
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError(f"score_conditional needs (N, L) tokens, got {tuple(tokens.shape)}")
    world, free = cond.world, cond.free
    if int(tokens.max()) >= world.vocab_size or int(tokens.min()) < 0:
        raise ValueError(f"token ids outside world {world.name}'s vocabulary ({world.vocab_size})")
    n, count = tokens.shape[0], int(free.sum())
    reference = cond.transition_reference()
    log_p = cond.log_prob(tokens)
    finite = torch.isfinite(log_p)
    nll = -log_p[finite] / max(count, 1) / LN2
    nll_cond, nll_se = _mean_se(nll.tolist()) if nll.numel() else (math.nan, math.nan)
    rates = transition_rates(free_pairs(tokens, free), reference)
    possible = (
        transition_rates(free_pairs(tokens[finite], free), reference) if finite.any() else None
    )
    floors = [
        transition_rates(free_pairs(cond.sample(n, generator), free), reference)
        for _ in range(floor_repeats)
    ]
    return {
        "samples": n,
        "length": cond.length,
        "free": count,
        "nll_cond": nll_cond,
        "nll_cond_se": nll_se,
        "entropy_cond": cond.entropy() / max(count, 1) / LN2,
        **rate_figures(rates, possible, floors),
        "violation_rate": float((~finite).double().mean()),
        "constraint_rate": float(world.constraint_rate(tokens.cpu()).mean()),
    }


def infill_ceiling(cond: Conditional) -> dict[str, float]:
    """What an infill of the free positions can score against a truth drawn from ``cond``
    (``task=infill`` in a world), per span:

    - ``exact_token_accuracy``: the mean over free positions of sum_v p(x_i = v | fixed)^2, the
      token accuracy an exact conditional sampler (the oracle) averages;
    - ``best_token_accuracy``: the mean of max_v p(x_i = v | fixed), the most any infill can
      average (each position's most likely token);
    - ``exact_span_exact``: sum_x p(x | fixed)^2, the span exact-match an exact sampler averages.
    """
    marginals = cond.token_marginals()[cond.free]
    return {
        "exact_token_accuracy": float((marginals**2).sum(-1).mean()),
        "best_token_accuracy": float(marginals.max(-1).values.mean()),
        "exact_span_exact": cond.collision(),
    }
