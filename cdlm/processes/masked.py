"""Absorbing-state ("masked") discrete diffusion: MDLM (Sahoo et al. 2024), LLaDA (Nie et al.
2025).

Each token is replaced by [MASK] independently with probability 1 - keep(t). The network sees
token ids (bidirectionally) and predicts the clean token at every position. The SUBS
parameterisation (MDLM Sec. 3.2) puts no probability on [MASK] and carries unmasked tokens over
unchanged, which makes the continuous-time ELBO a weighted cross-entropy on masked positions:

    -log p(x) <= E_t [ -keep'(t) / (1 - keep(t)) * sum_{l masked} -log p_theta(x_l | z_t) ].

The network gets no time input: the number of masks already tells it t (MDLM Sec. 3.4), and a
time-free denoiser is what lets the cached sampler skip calls exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction, full_precision
from cdlm.processes.base import LevelMetrics, LossOutput, TokenProcess, stratified_times
from cdlm.schedules import LogLinearMaskSchedule, MaskSchedule


class MaskedDenoiser:
    """SUBS: log-probabilities with -inf on [MASK], and unmasked inputs copied through."""

    def __init__(self, network: nn.Module, mask_id: int) -> None:
        self.network, self.mask_id = network, mask_id

    def __call__(self, z: Tensor, t: Tensor, self_cond: Tensor | None = None) -> Prediction:
        logits = full_precision(self.network(z, torch.zeros_like(t, dtype=torch.float32)))
        no_mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        no_mask[self.mask_id] = True
        logp = logits.masked_fill(no_mask, -math.inf).log_softmax(-1)
        carried = torch.full_like(logp, -math.inf).scatter_(-1, z[..., None], 0.0)
        return Prediction(logits=torch.where((z != self.mask_id)[..., None], carried, logp))


class MaskedProcess(TokenProcess):
    """Masked diffusion over token ids.

    Args:
        vocab_size: tokenizer size, [MASK] included (filled in from the data at build time).
        mask_id: the [MASK] token id (filled in from the tokenizer).
        eos_id: the end-of-sequence id (filled in from the tokenizer); block samplers stop once
            every sequence has ended.
        schedule: a ``cdlm.schedules.MaskSchedule`` (log-linear or cosine).
        t_min: smallest training time; the ELBO weight 1/t is unbounded at 0 (MDLM uses 1e-3).
    """

    kind = "masked"
    default_sampler = "ancestral"
    causal = False

    def __init__(
        self,
        vocab_size: int,
        mask_id: int,
        eos_id: int | None = None,
        schedule: MaskSchedule | None = None,
        t_min: float = 1e-3,
    ) -> None:
        super().__init__()
        schedule = schedule if schedule is not None else LogLinearMaskSchedule()
        if not isinstance(schedule, MaskSchedule):
            raise ValueError(
                f"process=masked needs a masking schedule (mask_schedule=loglinear or "
                f"mask_schedule=cosine), got {type(schedule).__name__}"
            )
        if not 0 <= mask_id < vocab_size:
            raise ValueError(f"mask_id {mask_id} is outside the vocabulary of {vocab_size}")
        self.vocab_size, self.mask_id, self.eos_id = vocab_size, mask_id, eos_id
        self.schedule, self.t_min = schedule, t_min

    @property
    def canvas_id(self) -> int:
        return self.mask_id

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        return MaskedDenoiser(network, self.mask_id)

    def corrupt(
        self, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Masks each token with probability 1 - keep(t). Returns (z_t, masked) of (B, L)."""
        u = torch.rand(tokens.shape, device=tokens.device, generator=generator)
        masked = u >= self.schedule.keep(t)[:, None]
        return torch.where(masked, self.mask_id, tokens), masked

    def elbo(
        self, denoiser: Denoiser, tokens: Tensor, t: Tensor, z: Tensor, masked: Tensor
    ) -> Tensor:
        """The ELBO integrand for given times and masks, in nats per token, (B,)."""
        nll = F.cross_entropy(
            denoiser(z, t).logits.flatten(0, 1), tokens.flatten(), reduction="none"
        ).view_as(tokens)
        weight = -self.schedule.dkeep(t) / (1.0 - self.schedule.keep(t))
        return weight * (nll * masked).sum(-1) / tokens.shape[1]

    def sample_t(self, n: int, device: torch.device, generator=None) -> Tensor:
        return self.t_min + (1.0 - self.t_min) * stratified_times(n, device, generator)

    def loss(self, denoiser: Denoiser, tokens: Tensor) -> LossOutput:
        """The continuous-time ELBO with stratified t: an unbiased bound on -log p in nats."""
        t = self.sample_t(tokens.shape[0], tokens.device)
        z, masked = self.corrupt(tokens, t)
        nats = self.elbo(denoiser, tokens, t, z, masked).mean()
        return LossOutput(nats, {"bits_per_token": nats.detach() / math.log(2)})

    @torch.no_grad()
    def evaluate_at(
        self, denoiser: Denoiser, tokens: Tensor, t: float, generator: torch.Generator | None = None
    ) -> LevelMetrics:
        """CE/accuracy of the prediction on the masked positions at mask time t."""
        tt = torch.full((tokens.shape[0],), t, device=tokens.device)
        z, masked = self.corrupt(tokens, tt, generator)
        logits = denoiser(z, tt).logits[masked]
        target = tokens[masked]
        if target.numel() == 0:
            return LevelMetrics(ce=torch.zeros(()), acc=torch.ones(()))
        ce = F.cross_entropy(logits, target)
        return LevelMetrics(ce=ce, acc=(logits.argmax(-1) == target).float().mean())
