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
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm import rng
from cdlm.denoiser import Denoiser, Prediction
from cdlm.processes.base import Corrupted, LevelEval, LossOutput
from cdlm.processes.complement import with_masked_complement
from cdlm.processes.losses import check_levers, mean_hidden, next_token_loss, valid_mask
from cdlm.processes.masked_denoiser import MaskedDenoiser
from cdlm.processes.prompts import hold_tokens, prompt_of
from cdlm.processes.support import TokenSupport
from cdlm.processes.token_process import TokenProcess
from cdlm.schedules import LogLinearMaskSchedule, MaskSchedule
from cdlm.time_samplers import TimeSampler, bounded_times


class MaskedProcess(TokenProcess):
    """Masked diffusion over token ids.

    Args:
        vocab_size: tokenizer size, [MASK] included (filled in from the data at build time).
        mask_id: the [MASK] token id (filled in from the tokenizer).
        eos_id: the end-of-sequence id (filled in from the tokenizer); block samplers stop once
            every sequence has ended.
        schedule: a ``cdlm.schedules.MaskSchedule`` (log-linear or cosine).
        t_min: smallest training time; the ELBO weight 1/t is unbounded at 0 (MDLM uses 1e-3).
        shift: Dream-style shifted prediction (position i predicted from output i - 1, after a
            BOS = ``eos_id``); needed to start from an AR checkpoint or to train an AR phase
            (``cdlm.training.phases``), and faster from scratch.
        time_sampler: where training draws t (``cdlm.time_samplers``: stratified uniform, the
            unbiased bound, by default; a mask-rate curriculum; CDCD warping). Evaluation always
            uses stratified uniform t, so the logged bound is the true one.
        importance_weight: divide each row's training integrand by the time sampler's
            density at its level, so the training loss is an unbiased estimate of the bound
            under any proposal that draws every level.
        flat_weight: train on the masked CE with weight 1 instead of the ELBO's
            -keep'/(1 - keep) (1/t, log-linear); Sahoo et al. 2026. Evaluation keeps the bound.
        complementary: also train every sequence under its complementary mask
            (``cdlm.processes.complement``), so every token is a target once per step.
        excluded: ids x0_hat never predicts besides [MASK] (``cdlm.processes.support``; filled
            in from the data: the specials its rows never hold); empty, the default, and in
            every model file written before the key: only [MASK], as SUBS always had it. The
            loss keeps its form: it scores clean tokens, which lie inside the support (data
            outside it is refused), so it is the same masked CE, read from a softmax over the
            support; that is still a distribution over x0, so the ELBO is still a bound, and
            for a network that already gave the excluded ids no mass, the same number.
    """

    kind = "masked"
    default_sampler = "ancestral"
    loss_is_bound = True  # in eval mode the loss is the continuous-time ELBO
    exact_likelihood = False
    noise_levels = True
    sequential = False
    causal = False
    trains_on_prompts = True

    def __init__(
        self,
        vocab_size: int,
        mask_id: int,
        eos_id: int | None = None,
        schedule: MaskSchedule | None = None,
        t_min: float = 1e-3,
        time_sampler: TimeSampler | None = None,
        shift: bool = False,
        importance_weight: bool = False,
        flat_weight: bool = False,
        complementary: bool = False,
        excluded: Sequence[int] = (),
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
        self.support = TokenSupport(vocab_size, [mask_id, *excluded], self.kind)
        self.schedule, self.t_min = schedule, t_min
        self.time_sampler = time_sampler if time_sampler is not None else TimeSampler()
        self.time_sampler.attach(self.schedule)
        self.importance_weight, self.flat_weight = importance_weight, flat_weight
        self.complementary = complementary
        check_levers(self.time_sampler, importance_weight, complementary)

    @property
    def canvas_id(self) -> int:
        return self.mask_id

    @property
    def next_token_layout(self) -> bool:
        """Whether the network can be trained as a next-token predictor (an AR phase)."""
        return self.shift

    def grid_schedule(self) -> nn.Module:
        return self.schedule

    @torch.no_grad()
    def score_hidden(self, denoiser: Denoiser, ids: Tensor, hidden: Tensor) -> Tensor:
        """The hidden tokens masked, read at t = 0.5 (a SUBS prediction ignores its level)."""
        z = torch.where(hidden, self.mask_id, ids)
        t = torch.full((ids.shape[0],), 0.5, device=ids.device)
        return mean_hidden(
            self.predict(denoiser, Corrupted(ids, ids, z, t, hidden)).logits, ids, hidden
        )

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        bos = self.eos_id if self.shift else None
        return MaskedDenoiser(network, self.mask_id, bos, self.support)

    def keep(self, t: Tensor) -> Tensor:
        """keep(t) shaped to mask (B, L): t is (B,) or per token (B, L)."""
        keep = self.schedule.keep(t)
        return keep[:, None] if keep.dim() == 1 else keep

    def corrupt(
        self, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None
    ) -> Corrupted:
        """Masks each token with probability 1 - keep(t); t: (B,) or per token (B, L)."""
        u = torch.rand(tokens.shape, device=tokens.device, generator=generator)
        masked = u >= self.keep(t)
        z = torch.where(masked, self.mask_id, tokens)
        return Corrupted(tokens=tokens, x0=tokens, x_t=z, t=t, noisy=masked)

    def predict(self, denoiser: Denoiser, c: Corrupted) -> Prediction:
        """The denoiser's prediction for a corruption (block diffusion adds the clean stream)."""
        return denoiser(c.x_t, c.t)

    def weight(self, t: Tensor) -> Tensor:
        """The ELBO weight of the masked CE at t: -keep'(t) / (1 - keep(t)) (MDLM eq. 10)."""
        return -self.schedule.dkeep(t) / (1.0 - self.schedule.keep(t))

    def training_weight(self, t: Tensor) -> Tensor:
        """The weight the loss puts on the masked CE: the ELBO's, or 1 in training with
        ``flat_weight`` (evaluation always reports the bound)."""
        return torch.ones_like(t) if self.training and self.flat_weight else self.weight(t)

    def elbo(self, denoiser: Denoiser, c: Corrupted, valid: Tensor) -> tuple[Tensor, Tensor]:
        """(ELBO integrand summed over valid positions (B,), mean CE per masked token (B,)),
        both in nats."""
        return self.elbo_terms(self.predict(denoiser, c).logits, c, valid)

    def elbo_terms(self, logp: Tensor, c: Corrupted, valid: Tensor) -> tuple[Tensor, Tensor]:
        """``elbo`` from the prediction's log-probabilities ``logp`` (B, L, V)."""
        nll = F.cross_entropy(logp.flatten(0, 1), c.tokens.flatten(), reduction="none").view_as(
            c.tokens
        )
        scored = c.noisy & valid
        nll = nll.masked_fill(~scored, 0.0)  # a PAD outside the support: infinite, unscored
        weight = self.training_weight(c.t)
        weight = weight[:, None] if weight.dim() == 1 else weight  # per sequence or per token
        per_masked = nll.sum(-1) / scored.sum(-1).clamp_min(1)
        return (weight * nll).sum(-1), per_masked

    def unit_level(self, t: Tensor) -> Tensor:
        """A level t in [t_min, 1] in the time sampler's own units, [0, 1]."""
        return (t - self.t_min) / (1.0 - self.t_min)

    def sample_t(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | None = None,
        length: int | None = None,
    ) -> Tensor:
        """Times in [t_min, 1): the time sampler's draw in training, stratified uniform (the
        draw of the unbiased bound) in evaluation."""
        return bounded_times(self.time_sampler, self.training, n, device, generator, self.t_min)

    def loss(self, denoiser: Denoiser, batch: dict[str, Tensor], generator=None) -> LossOutput:
        """The continuous-time ELBO integrand in nats per valid token, at t from ``sample_t``
        (in evaluation an unbiased bound on -log p). In the AR phase of training: the next-token
        NLL of clean input under causal attention. A prompt (``cdlm.processes.prompts``) is
        never masked, as at sampling, nor scored: the bound is then on the response given it."""
        tokens, valid = batch["tokens"], valid_mask(batch)
        self.support.check(tokens, valid)
        if self.training and self.ar_phase:
            if not self.shift:
                raise ValueError("an AR phase needs process.shift=true (next-token layout)")
            zeros = torch.zeros(tokens.shape[0], device=tokens.device)
            return next_token_loss(denoiser(tokens, zeros, subs=False).logits, tokens, valid)
        t = self.sample_t(tokens.shape[0], generator, device=tokens.device, length=tokens.shape[1])
        c = self.corrupt(tokens, t, generator)
        if self.training and self.complementary:
            c = with_masked_complement(c, self.schedule, self.mask_id, self.t_min)
            valid = valid.repeat(2, 1)
        prompt = prompt_of(batch)
        if prompt is not None:  # after the complement, which would mask a held prompt
            c = hold_tokens(c, prompt.repeat(len(c.t) // len(t)), self.mask_id)
        integrand, per_masked = self.elbo(denoiser, c, valid)
        if self.training and self.importance_weight:
            integrand = integrand / self.time_sampler.density(self.unit_level(c.t))
        nats = integrand.sum() / valid.sum().clamp_min(1)
        observation = None
        if self.training and t.dim() == 1:  # a learned time sampler sees one level per row
            seen = (c.noisy & valid).any(-1)  # a row without masks says nothing about its level
            u = self.unit_level(c.t)
            observation = (u[seen].detach(), per_masked[seen].detach())
        return LossOutput(nats, {"bits_per_token": nats.detach() / math.log(2)}, observation)

    @torch.no_grad()
    def evaluate_at(
        self, denoiser: Denoiser, tokens: Tensor, t: float | Tensor, generator=None
    ) -> LevelEval:
        """The model's log-probabilities at mask time t (a float, (B,) or per token (B, L)),
        scored on the masked positions, beside each position's own evidence: nothing for a
        masked token (0), the token itself for a visible one."""
        if not torch.is_tensor(t):
            t = torch.full((tokens.shape[0],), float(t), device=tokens.device)
        c = self.corrupt(tokens, t, generator)
        logits = self.predict(denoiser, c).logits
        seen = torch.full(logits.shape, -math.inf, device=tokens.device)
        seen.scatter_(-1, c.x_t[..., None], 0.0)
        evidence = torch.where(c.noisy[..., None], 0.0, seen)
        return LevelEval(logits, tokens, c.noisy, evidence)

    def start(
        self, x: Tensor, ids: Tensor, editable: Tensor, seeded: Tensor, strength: float, generator
    ) -> Tensor:
        """The starting canvas: the fixed tokens of ``ids`` (B, L), never masked, and the
        editable positions masked; with strength < 1 (editing) each ``seeded`` editable position
        (text to edit, not a blank) is masked with probability 1 - keep(strength) and otherwise
        keeps its token."""
        if ((ids == self.mask_id) & ~editable).any():
            raise ValueError("a fixed region contains the [MASK] token itself; remove it")
        masked = editable
        if strength < 1.0:
            u = rng.rand(ids.shape, generator, device=ids.device)
            keep = self.schedule.keep(torch.tensor(strength, device=ids.device))
            masked = editable & ~(seeded & (u < keep))
        return torch.where(masked, self.mask_id, ids)

    def hold_fixed(self, denoiser: Denoiser, ids: Tensor, editable: Tensor, generator) -> Denoiser:
        """Nothing to do: fixed tokens are never masked, and SUBS carries unmasked tokens
        through every step unchanged."""
        return denoiser
