"""A model's excess over its world's oracle: the model's likelihood bound minus the bound of the
same process run on the world's exact posterior (``cdlm.world_model.oracle_model``), on the same
sequences with the same random draws, in bits per token.

Pairing is what makes the figure cheap: the bound of a diffusion process is a Monte Carlo
estimate whose noise (the level t and the corruption drawn for each sequence) is mostly shared by
the model and its oracle, so their difference varies far less than either bound. The draws are
keyed on (seed, draw, group) alone, never on what ran before, so the oracle's figures for a fixed
key can be computed once and reused for every checkpoint of a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm import rng
from cdlm.likelihood.elbo import elbo
from cdlm.likelihood.terms import likelihood_denoiser
from cdlm.model_file import Model
from cdlm.worlds.base import World

LN2 = math.log(2)
_KEY = 1_000_003  # a prime wider than any draw or group count: distinct keys per (draw, group)


@dataclass
class GroupBits:
    """bits: (draws, groups) the bound of each group of sequences, bits/token; tokens: (groups,)
    the scored tokens of each group (its weight in the mean); sequences: how many in all."""

    bits: Tensor
    tokens: Tensor
    sequences: int

    def bound(self) -> tuple[float, float]:
        """The token-weighted bound over groups (draws averaged first) and its standard error."""
        return weighted_mean_se(self.bits.mean(0), self.tokens)

    def to_json(self) -> dict:
        """The groups as JSON (a job's ``bound.json``), so a study reads them without a model."""
        return {"bits": self.bits.tolist(), "tokens": self.tokens.tolist(),
                "sequences": self.sequences}  # fmt: skip

    @classmethod
    def from_json(cls, saved: dict) -> GroupBits:
        bits = torch.tensor(saved["bits"], dtype=torch.float64)
        return cls(bits, torch.tensor(saved["tokens"]), int(saved["sequences"]))


@dataclass
class PairedBound:
    """A model's bound beside its oracle's, bits/token. excess_se: the standard error of the
    paired difference over groups of sequences (the draws averaged within each group first, since
    every draw reads the same sequences)."""

    bound_bits: float
    oracle_bits: float
    excess_bits: float
    excess_se: float
    sequences: int
    groups: int
    draws: int


def weighted_mean_se(values: Tensor, tokens: Tensor) -> tuple[float, float]:
    """The token-weighted mean of per-group ``values`` and the standard error of a weighted mean
    of independent groups (NaN for one group)."""
    w = tokens.double() / tokens.sum()
    mean = float((w * values).sum())
    n = len(w)
    se = math.sqrt(float((w**2 * (values - mean) ** 2).sum()) * n / (n - 1)) if n > 1 else math.nan
    return mean, se


def draw_seed(seed: int, draw: int, group: int) -> int:
    """The evaluation seed of one group's draw (through ``rng`` it never meets training's)."""
    return (seed * _KEY + draw) * _KEY + group


@torch.no_grad()
def group_bits(
    model: Model, tokens: Tensor, *, seed: int, draws: int, group_size: int
) -> GroupBits:
    """The process's own bound (``cdlm.evaluation.bound``: exact NLL, masked/uniform/block
    ELBO, the gaussian VDM ELBO) of ``tokens`` (N, L) in groups of ``group_size`` sequences, one
    batch each, ``draws`` times; an exact likelihood is drawn once. PAD is not scored."""
    if draws < 1 or group_size < 1:
        raise ValueError(f"draws and group_size must be >= 1, got {draws} and {group_size}")
    draws = 1 if model.process.exact_likelihood else draws
    device = next(model.network.parameters()).device
    groups = tokens.split(group_size)
    pad = model.tokenizer.pad_token_id
    counts = torch.tensor([int((g != pad).sum()) if pad is not None else g.numel() for g in groups])
    bits = torch.tensor(
        [[_bits(model, g.to(device), draw_seed(seed, d, i)) for i, g in enumerate(groups)]
         for d in range(draws)],
        dtype=torch.float64,
    )  # fmt: skip
    return GroupBits(bits, counts, len(tokens))


def _bits(model: Model, tokens: Tensor, seed: int) -> float:
    """One batch's bound in bits/token, its every draw a function of ``seed``."""
    process, device = model.process, tokens.device
    with rng.seeded(seed, device):  # a process's loss draws from the global stream
        if not process.loss_is_bound:  # a CE-trained gaussian: its VDM ELBO
            denoiser = likelihood_denoiser(process, model.network)
            found = elbo(denoiser, process, tokens, generator=rng.generator(seed, device))
            return float(found.total.mean())
        pad = model.tokenizer.pad_token_id
        valid = tokens != pad if pad is not None else torch.ones_like(tokens, dtype=torch.bool)
        out = process.loss(process.make_denoiser(model.network), {"tokens": tokens, "valid": valid})
        return out.loss.item() / LN2


def nll_group_bits(world: World, tokens: Tensor, *, group_size: int) -> GroupBits:
    """The world's exact -log2 p per token of ``tokens`` (N, L) in groups of ``group_size``: the
    floor of every bound, for a process whose bound at the exact posterior is not tight."""
    groups = tokens.split(group_size)
    bits = torch.stack([-world.log_prob(g).double().sum() / g.numel() / LN2 for g in groups])
    counts = torch.tensor([g.numel() for g in groups])
    return GroupBits(bits[None], counts, len(tokens))


def paired_bound(model: GroupBits, oracle: GroupBits) -> PairedBound:
    """The two bounds and their paired difference, each a token-weighted mean over groups."""
    if model.bits.shape[1] != oracle.bits.shape[1] or not torch.equal(model.tokens, oracle.tokens):
        raise ValueError("the model and its oracle must be scored on the same groups of sequences")
    mine, theirs = model.bits.mean(0), oracle.bits.mean(0)
    excess, se = weighted_mean_se(mine - theirs, model.tokens)
    return PairedBound(
        bound_bits=weighted_mean_se(mine, model.tokens)[0],
        oracle_bits=weighted_mean_se(theirs, model.tokens)[0],
        excess_bits=excess,
        excess_se=se,
        sequences=model.sequences,
        groups=len(model.tokens),
        draws=max(model.bits.shape[0], oracle.bits.shape[0]),
    )
