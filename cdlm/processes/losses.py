"""The token-level loss pieces the processes share: which positions count, their mean, the
next-token loss of an AR phase, the mean score of hidden tokens, and which training levers
combine."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from cdlm.denoiser import full_precision
from cdlm.processes.base import LossOutput
from cdlm.time_samplers import TimeSampler, check_reweightable


def valid_mask(batch: dict[str, Tensor]) -> Tensor:
    """(B, L) bool: the positions that are scored: PAD excluded when the data pads (as MDLM
    does), and the prompt of prompt→response rows (``cdlm.processes.prompts``), which the model
    conditions on and never predicts."""
    tokens = batch["tokens"]
    valid = batch.get("valid")
    valid = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid.bool()
    prompt = batch.get("prompt")
    return valid if prompt is None else valid & ~prompt.bool()


def masked_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``values`` (B, L) over the ``valid`` positions; an infinite value outside them
    (the NLL of a PAD that x0_hat gives no mass, ``cdlm.processes.support``) counts as 0."""
    return values.masked_fill(~valid, 0.0).sum() / valid.sum().clamp_min(1)


def next_token_loss(logits: Tensor, tokens: Tensor, valid: Tensor) -> LossOutput:
    """The AR phase of a shifted diffusion model: the next-token NLL of clean input, from
    ``logits`` (B, L, V) whose row i predicts ``tokens[:, i]`` (the network's outputs 0..L-1 on
    [BOS, x_0, ..., x_{L-1}] under causal attention)."""
    nll = F.cross_entropy(
        full_precision(logits).flatten(0, 1), tokens.flatten(), reduction="none"
    ).view_as(tokens)
    nats = masked_mean(nll, valid)
    return LossOutput(nats, {"ar_bits_per_token": nats.detach() / math.log(2)})


def mean_hidden(logp: Tensor, ids: Tensor, hidden: Tensor) -> Tensor:
    """(B,) the mean over each row's ``hidden`` positions of log p(ids) from ``logp`` (B, L, V)."""
    token = logp.gather(-1, ids[..., None]).squeeze(-1)
    return token.masked_fill(~hidden, 0.0).sum(1) / hidden.sum(1)


def level_observation(t: Tensor, token_losses: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """(levels, per-sequence mean losses) of the rows that share one level, for the time
    sampler's ``observe``: rows with per-token levels ``t`` (B, L) say nothing about one level."""
    shared = torch.ones(t.shape[0], dtype=torch.bool, device=t.device)
    if t.dim() == 2:
        shared = (t == t[:, :1]).all(-1)
    per_seq = (token_losses * valid).sum(-1) / valid.sum(-1).clamp_min(1)
    level = t if t.dim() == 1 else t[:, 0]
    return level[shared].detach(), per_seq[shared].detach()


def check_levers(sampler: TimeSampler, importance_weight: bool, complementary: bool) -> None:
    """Refuses training levers that do not combine: importance weights need a proposal that
    draws every level, and the complementary half's level is not drawn from the proposal."""
    if importance_weight:
        check_reweightable(sampler, "process.importance_weight")
    if importance_weight and complementary:
        raise ValueError(
            "process.importance_weight and process.complementary do not combine: the "
            "complementary level is not a draw of the time sampler; set one of them to false"
        )
