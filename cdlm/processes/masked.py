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
from cdlm.evaluation.oracle import markov_marginals
from cdlm.processes.base import (
    AttentionPhases,
    LevelMetrics,
    LossOutput,
    TokenProcess,
    level_metrics,
)
from cdlm.schedules import LogLinearMaskSchedule, MaskSchedule
from cdlm.time_samplers import TimeSampler, stratified_times


class MaskedDenoiser:
    """SUBS: log-probabilities with -inf on [MASK], and unmasked inputs copied through.

    With ``shift_from`` (a BOS id) the prediction for position i is read from the network's
    output at position i - 1 of the input [BOS, z_0, ..., z_{L-1}] (Dream, Ye et al. 2025): the
    layout of a next-token predictor, so an AR checkpoint drops in unchanged, and a masked
    position's left neighbour reaches its prediction through the residual stream rather than
    only through attention (which is what keeps a masked model from scratch on the unigram
    plateau for hundreds of steps).
    """

    def __init__(self, network: nn.Module, mask_id: int, shift_from: int | None = None) -> None:
        self.network, self.mask_id, self.shift_from = network, mask_id, shift_from

    def __call__(
        self,
        z: Tensor,
        t: Tensor,
        self_cond: Tensor | None = None,
        label: Tensor | None = None,
        subs: bool = True,
    ) -> Prediction:
        """``subs=False`` skips the carry-over of unmasked inputs: the plain predictions at every
        position (with a shifted causal network on clean input, next-token predictions)."""
        zeros = torch.zeros(z.shape[0], device=z.device)
        if self.shift_from is None:
            logits = full_precision(self.network(z, zeros, label=label))
        else:
            bos = torch.full_like(z[:, :1], self.shift_from)
            out = self.network(torch.cat([bos, z], dim=1), zeros, label=label)
            logits = full_precision(out[:, :-1])
        no_mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        no_mask[self.mask_id] = True
        logp = logits.masked_fill(no_mask, -math.inf).log_softmax(-1)
        if not subs:
            return Prediction(logits=logp)
        carried = torch.full_like(logp, -math.inf).scatter_(-1, z[..., None], 0.0)
        return Prediction(logits=torch.where((z != self.mask_id)[..., None], carried, logp))


class MaskedProcess(AttentionPhases, TokenProcess):
    """Masked diffusion over token ids.

    Args:
        vocab_size: tokenizer size, [MASK] included (filled in from the data at build time).
        mask_id: the [MASK] token id (filled in from the tokenizer).
        eos_id: the end-of-sequence id (filled in from the tokenizer); block samplers stop once
            every sequence has ended.
        schedule: a ``cdlm.schedules.MaskSchedule`` (log-linear or cosine).
        t_min: smallest training time; the ELBO weight 1/t is unbounded at 0 (MDLM uses 1e-3).
        shift: Dream-style shifted prediction (position i predicted from output i - 1, after a
            BOS = ``eos_id``); needed to start from an AR checkpoint, and faster from scratch.
        ar_steps: train the first ``ar_steps`` batches as a next-token predictor (causal
            attention, clean input; needs ``shift``), then switch to the masked objective: AR
            pre-training inside the same run and budget (DiffuLLaMA / Dream adaptation).
        anneal_steps: after the AR phase (or from the start, e.g. with ``init_from`` an AR
            checkpoint), open attention from causal to full over this many batches, each future
            key visible with a probability rising from 0 to 1 (DiffuLLaMA, Gong et al. 2025).
        time_sampler: where training draws t (``cdlm.time_samplers``: stratified uniform, the
            unbiased bound, by default; a mask-rate curriculum; CDCD warping). Validation always
            uses stratified uniform t, so the logged bound is the true one.
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
        time_sampler: TimeSampler | None = None,
        shift: bool = False,
        ar_steps: int = 0,
        anneal_steps: int = 0,
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
        if shift and eos_id is None:
            raise ValueError("shift=true needs eos_id (the BOS the shifted input starts with)")
        self.vocab_size, self.mask_id, self.eos_id, self.shift = vocab_size, mask_id, eos_id, shift
        self.schedule, self.t_min = schedule, t_min
        self.time_sampler = time_sampler if time_sampler is not None else TimeSampler()
        self._init_phases(ar_steps, anneal_steps, shift)

    @property
    def canvas_id(self) -> int:
        return self.mask_id

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        return MaskedDenoiser(network, self.mask_id, self.eos_id if self.shift else None)

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
        return self._elbo_terms(denoiser, tokens, t, z, masked)[0]

    def _elbo_terms(
        self, denoiser: Denoiser, tokens: Tensor, t: Tensor, z: Tensor, masked: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(ELBO integrand (B,), mean CE per masked token (B,)), both in nats."""
        nll = F.cross_entropy(
            denoiser(z, t).logits.flatten(0, 1), tokens.flatten(), reduction="none"
        ).view_as(tokens)
        weight = -self.schedule.dkeep(t) / (1.0 - self.schedule.keep(t))
        masked_nll = (nll * masked).sum(-1)
        per_masked = masked_nll / masked.sum(-1).clamp_min(1)
        return weight * masked_nll / tokens.shape[1], per_masked

    def sample_t(self, n: int, device: torch.device, generator=None) -> Tensor:
        """Uniform stratified times in [t_min, 1): the draw of the unbiased bound."""
        return self.t_min + (1.0 - self.t_min) * stratified_times(n, device, generator)

    def loss(self, denoiser: Denoiser, tokens: Tensor) -> LossOutput:
        """The continuous-time ELBO integrand at t from the time sampler (training) or
        stratified uniform t (evaluation: an unbiased bound on -log p in nats). In the AR phase
        of training: the next-token NLL of clean input under causal attention."""
        n = tokens.shape[0]
        if self.training and self._training_phase(denoiser):
            logits = denoiser(tokens, torch.zeros(n, device=tokens.device), subs=False).logits
            nats = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            return LossOutput(nats, {"ar_bits_per_token": nats.detach() / math.log(2)})
        if self.training:
            u = self.time_sampler(n, tokens.device)
            t = self.t_min + (1.0 - self.t_min) * u
        else:
            t = self.sample_t(n, tokens.device)
        z, masked = self.corrupt(tokens, t)
        integrand, per_masked = self._elbo_terms(denoiser, tokens, t, z, masked)
        if self.training:
            seen = masked.any(-1)  # a row without masks says nothing about its level
            self.time_sampler.observe(u[seen], per_masked[seen])
        nats = integrand.mean()
        return LossOutput(nats, {"bits_per_token": nats.detach() / math.log(2)})

    @torch.no_grad()
    def evaluate_at(
        self,
        denoiser: Denoiser,
        tokens: Tensor,
        t: float,
        generator: torch.Generator | None = None,
        log_prior: Tensor | None = None,
        transition: Tensor | None = None,
    ) -> LevelMetrics:
        """CE/accuracy of the prediction on the masked positions at mask time t; with the
        unigram ``log_prior`` (V,) also of the no-context readout (the prior itself: a masked
        token's own observation says nothing); with a bigram ``transition`` (V, V) as well, of
        the exact bigram denoiser (``cdlm.evaluation.oracle``)."""
        tt = torch.full((tokens.shape[0],), t, device=tokens.device)
        z, masked = self.corrupt(tokens, tt, generator)
        logits = denoiser(z, tt).logits[masked]
        baseline = oracle = None
        if log_prior is not None:
            baseline = log_prior.float().expand_as(logits)
            if transition is not None:
                # a visible token is its own observation; a masked one observes nothing
                seen = torch.full((*z.shape, self.vocab_size), -math.inf, device=z.device)
                seen.scatter_(-1, z[..., None], 0.0)
                emission = torch.where(masked[..., None], 0.0, seen)
                marginals = markov_marginals(emission, transition, log_prior.exp())
                oracle = marginals.clamp_min(1e-30).log()[masked]
        return level_metrics(logits, tokens[masked], baseline, oracle)

    def start(
        self,
        x: Tensor,
        ids: Tensor,
        editable: Tensor,
        seeded: Tensor,
        strength: float,
        generator,
    ) -> Tensor:
        """The starting canvas: the fixed tokens of ``ids`` (B, L), never masked, and the
        editable positions masked; with strength < 1 (editing) each ``seeded`` editable position
        (text to edit, not a blank) is masked with probability 1 - keep(strength) and otherwise
        keeps its token."""
        if ((ids == self.mask_id) & ~editable).any():
            raise ValueError("a fixed region contains the [MASK] token itself; remove it")
        masked = editable
        if strength < 1.0:
            u = torch.rand(ids.shape, device=ids.device, generator=generator)
            keep = self.schedule.keep(torch.tensor(strength, device=ids.device))
            masked = editable & ~(seeded & (u < keep))
        return torch.where(masked, self.mask_id, ids)

    def hold_fixed(self, denoiser: Denoiser, ids: Tensor, editable: Tensor, generator) -> Denoiser:
        """Nothing to do: fixed tokens are never masked, and SUBS carries unmasked tokens
        through every step unchanged."""
        return denoiser
