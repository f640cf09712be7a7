"""Training objectives of embedding diffusion. Each fixes what the network outputs, the wrappers
that turn that output into a full ``Prediction`` (logits and x0), and the loss.

* ``CrossEntropy`` (CDCD, Dieleman et al. 2022): the network outputs token logits; the loss is
  their cross-entropy; x0 is the expected embedding. ``readout_skip`` adds the no-context
  evidence of x_t to the logits (``ReadoutSkip``).
* ``X0MSE`` (Diffusion-LM, Li et al. 2022): the network outputs x0; the loss is ||x0_hat - x0||^2
  plus the rounding term -log p(w | x_low), x_low drawn from q(x_0 | w) at the lowest level.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction, full_precision
from cdlm.processes.base import Corrupted
from cdlm.processes.losses import masked_mean
from cdlm.processes.readouts import (
    ExpectedEmbedding,
    NearestReadout,
    ReadoutSkip,
    Temperature,
)


def token_ce(pred: Prediction, tokens: Tensor) -> Tensor:
    """(B, L) cross-entropy of the predicted logits on the clean tokens, nats (float64 logits
    stay float64)."""
    return F.cross_entropy(
        full_precision(pred.logits).flatten(0, 1), tokens.flatten(), reduction="none"
    ).view_as(tokens)


class CrossEntropy:
    """CDCD's objective: cross-entropy of token logits; x0 = softmax(logits) @ E."""

    output = "logits"

    def __init__(self, readout_skip: bool = False) -> None:
        self.readout_skip = readout_skip
        self.sees_token_levels = readout_skip  # the evidence carries each token's own level

    def out_dim(self, vocab_size: int, embed_dim: int) -> int:
        return vocab_size

    def wrap(
        self, denoiser: Denoiser, embedding: nn.Module, schedule, temperature: float = 1.0
    ) -> Denoiser:
        if self.readout_skip:
            denoiser = ReadoutSkip(denoiser, embedding, schedule)
        if temperature != 1.0:
            denoiser = Temperature(denoiser, temperature)
        return ExpectedEmbedding(denoiser, embedding)

    def loss(
        self, pred: Prediction, c: Corrupted, valid: Tensor, process, generator=None
    ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """(loss, metrics, per-token CE (B, L))."""
        ce_tokens = token_ce(pred, c.tokens)
        ce = masked_mean(ce_tokens, valid)
        return ce, {"ce": ce.detach()}, ce_tokens


class X0MSE:
    """Diffusion-LM's objective: the network predicts x0; loss = ||x0_hat - x0||^2 (summed over
    the embedding, averaged over positions) + the rounding NLL at the lowest noise level."""

    output = "x0"
    sees_token_levels = False
    readout_skip = False

    def out_dim(self, vocab_size: int, embed_dim: int) -> int:
        return embed_dim

    def wrap(
        self, denoiser: Denoiser, embedding: nn.Module, schedule, temperature: float = 1.0
    ) -> Denoiser:
        if temperature != 1.0:
            raise ValueError("temperature= applies to the cross-entropy objective (logits)")
        return NearestReadout(denoiser, embedding)

    def loss(
        self, pred: Prediction, c: Corrupted, valid: Tensor, process, generator=None
    ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        ce_tokens = token_ce(pred, c.tokens)
        mse = masked_mean((pred.x0.float() - c.x0.float()).pow(2).sum(-1), valid)
        zero = torch.zeros(c.tokens.shape[0], device=c.tokens.device)
        noise = torch.randn(c.x0.shape, device=c.x0.device, generator=generator, dtype=c.x0.dtype)
        low = process.noised(c.x0, zero, noise)
        rounding = masked_mean(
            token_ce(Prediction(logits=process.embedding.logits(low)), c.tokens), valid
        )
        ce = masked_mean(ce_tokens, valid)
        metrics = {"ce": ce.detach(), "mse": mse.detach(), "rounding": rounding.detach()}
        return mse + rounding, metrics, ce_tokens
