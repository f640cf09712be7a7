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


def bigram_transition(tokens: Tensor, vocab_size: int, strength: float = 10.0) -> Tensor:
    """(V, V) P(b | a) from consecutive pairs in the rows of ``tokens`` (N, L), smoothed towards
    the add-one unigram: (c(a, b) + strength p(b)) / (c(a) + strength)."""
    pairs = tokens[:, :-1].reshape(-1) * vocab_size + tokens[:, 1:].reshape(-1)
    counts = torch.bincount(pairs, minlength=vocab_size**2).view(vocab_size, vocab_size)
    unigram = torch.bincount(tokens.reshape(-1), minlength=vocab_size).float() + 1.0
    unigram = unigram / unigram.sum()
    counts = counts.float()
    return (counts + strength * unigram) / (counts.sum(1, keepdim=True) + strength)


def markov_marginals(log_emission: Tensor, transition: Tensor, initial: Tensor) -> Tensor:
    """Posterior marginals (B, L, V) of a Markov chain with start distribution ``initial`` (V,)
    and ``transition`` (V, V) given per-position emission log-likelihoods (B, L, V) (-inf
    allowed), by the scaled forward-backward algorithm in fp32 (each message renormalised)."""
    emission = (log_emission - log_emission.amax(-1, keepdim=True)).exp().float()
    transition = transition.float()
    length = emission.shape[1]
    forward = torch.empty_like(emission)
    message = initial.float() * emission[:, 0]
    forward[:, 0] = message / message.sum(-1, keepdim=True)
    for i in range(1, length):
        message = (forward[:, i - 1] @ transition) * emission[:, i]
        forward[:, i] = message / message.sum(-1, keepdim=True)
    posterior = torch.empty_like(emission)
    backward = torch.ones_like(emission[:, 0])
    posterior[:, -1] = forward[:, -1]
    for i in range(length - 2, -1, -1):
        backward = (emission[:, i + 1] * backward) @ transition.T
        backward = backward / backward.sum(-1, keepdim=True)
        joint = forward[:, i] * backward
        posterior[:, i] = joint / joint.sum(-1, keepdim=True)
    return posterior
