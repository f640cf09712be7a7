"""The exact denoiser of a bigram language model: what context alone can buy at a noise level.

With one noise level per sequence, corrupting tokens independently makes the clean sequence the
hidden chain of an HMM: a bigram (first-order Markov) prior over tokens, and each position's
observation (a noisy embedding, or the token or [MASK]) as its emission. The posterior marginals
p(x_i | observations) are then exact by forward-backward (Rabiner 1989), and their accuracy at a
noise level is what a denoiser that knows only bigram statistics achieves there. Beside the
no-context readout it bounds from below what "using context" can reach at that level, so a
target such as "2 x the no-context accuracy at t = 0.9" can be checked for feasibility.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.worlds.base import World
from cdlm.worlds.chain import pair_counts
from cdlm.worlds.transition import Transition


def bigram_transition(tokens: Tensor, vocab_size: int, strength: float = 10.0) -> Tensor:
    """(V, V) P(b | a) from consecutive pairs in the rows of ``tokens`` (N, L), smoothed towards
    the add-one unigram: (c(a, b) + strength p(b)) / (c(a) + strength)."""
    counts = pair_counts(tokens, vocab_size).float()
    unigram = torch.bincount(tokens.reshape(-1), minlength=vocab_size).float() + 1.0
    unigram = unigram / unigram.sum()
    return (counts + strength * unigram) / (counts.sum(1, keepdim=True) + strength)


def markov_marginals(log_emission: Tensor, transition: Tensor, initial: Tensor) -> Tensor:
    """Posterior marginals (B, L, V) of a Markov chain with start distribution ``initial`` (V,)
    and ``transition`` (V, V) given per-position emission log-likelihoods (B, L, V) (-inf
    allowed): the chain as a world (``cdlm.worlds``), whose scaled forward-backward runs on the
    CPU in float32, every message renormalised."""
    v, length = transition.shape[0], log_emission.shape[1]
    chain = World("bigram", None, torch.arange(v), initial, [Transition(transition)], length, v)
    return chain.posterior(log_emission).exp()
