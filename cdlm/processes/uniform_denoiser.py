"""The uniform process's denoiser (``cdlm.processes.uniform``) and the wrapper that holds a
prompt's tokens at sampling."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, NetworkDenoiser, Prediction, Wrapper, columns, full_precision
from cdlm.processes.uniform_support import NoiseSupport


class UniformDenoiser(NetworkDenoiser):
    """log-probabilities of the clean token at every position, none outside the noise's
    ``support`` (``cdlm.processes.uniform_support``; as SUBS gives [MASK] none). The network
    reads one level per sequence: per-token levels (B, L) are averaged, as the reference's
    ``_process_sigma`` averages its per-token sigma; without ``time_conditioning`` it reads 0
    (no level)."""

    def __init__(
        self,
        network: nn.Module,
        time_conditioning: bool = True,
        support: NoiseSupport | None = None,
    ) -> None:
        self.network, self.time_conditioning, self.support = network, time_conditioning, support

    def __call__(self, z: Tensor, t: Tensor, self_cond: Tensor | None = None, **kwargs):
        level = t.mean(-1) if t.dim() == 2 else t
        level = level if self.time_conditioning else torch.zeros_like(level)
        logits = full_precision(self.network(z, level, **kwargs))
        if self.support is not None:
            logits = self.support.restrict(logits)
        return Prediction(logits=logits.log_softmax(-1))


class HoldTokens(Wrapper):
    """Infilling: the network reads the fixed tokens of ``ids`` at the ``fixed`` positions and
    predicts them with certainty, and samplers that may revise any position ask
    ``held_tokens`` to leave them in place (for uniform noise the exact posterior
    q(x_s | x_t = x, x) is no point mass, so certainty alone would not hold them)."""

    def __init__(self, denoiser: Denoiser, ids: Tensor, fixed: Tensor) -> None:
        self.denoiser, self.ids, self.fixed = denoiser, ids, fixed

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        at = kwargs.get("positions")
        fixed, ids = columns(self.fixed, at), columns(self.ids, at)
        pred = self.denoiser(torch.where(fixed, ids, x_t), t, self_cond, **kwargs)
        certain = torch.full_like(pred.logits, -math.inf).scatter_(-1, ids[..., None], 0.0)
        return Prediction(logits=torch.where(fixed[..., None], certain, pred.logits))

    def held_tokens(self) -> tuple[Tensor, Tensor]:
        return self.ids, self.fixed
