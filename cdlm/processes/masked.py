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

from cdlm import rng
from cdlm.denoiser import Denoiser, NetworkDenoiser, Prediction, full_precision
from cdlm.processes.base import Corrupted, LevelEval, LossOutput
from cdlm.processes.losses import mean_hidden, next_token_loss, valid_mask
from cdlm.processes.prompts import hold_tokens, prompt_of
from cdlm.processes.token_process import TokenProcess
from cdlm.schedules import LogLinearMaskSchedule, MaskSchedule
from cdlm.time_samplers import TimeSampler, bounded_times


class MaskedDenoiser(NetworkDenoiser):
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
        subs: bool = True,
        *,
        positions: Tensor | None = None,
        **kwargs,
    ) -> Prediction:
        """z: the whole canvas (B, L). ``positions`` (W,): predict only those canvas positions
        (a window, e.g. a block attending to a KV cache passed in ``cache``); the network reads
        the inputs that feed them (z there, or z one to the left after the BOS when shifted),
        at those absolute positions. ``subs=False`` skips the carry-over of unmasked inputs.
        Other keywords (label, cache) reach the network. Returns (B, L or W, V)."""
        zeros = torch.zeros(z.shape[0], device=z.device)
        if positions is None:
            if self.shift_from is None:
                out = self.network(z, zeros, **kwargs)
            else:
                bos = torch.full_like(z[:, :1], self.shift_from)
                out = self.network(torch.cat([bos, z], dim=1), zeros, **kwargs)[:, :-1]
            seen = z
        else:
            inputs = self.window_inputs(z, positions)
            out = self.network(inputs, zeros, positions=positions, **kwargs)
            seen = z[:, positions.clamp(max=z.shape[1] - 1)]
        return self.parameterize(out, seen, subs)

    def parameterize(self, out: Tensor, seen: Tensor, subs: bool = True) -> Prediction:
        """SUBS (MDLM Sec. 3.2): log-probabilities of the network's ``out`` (B, W, V) with none
        on [MASK], and each unmasked input of ``seen`` (B, W) carried over (unless not
        ``subs``)."""
        logits = full_precision(out)
        no_mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        no_mask[self.mask_id] = True
        logp = logits.masked_fill(no_mask, -math.inf).log_softmax(-1)
        if not subs:
            return Prediction(logits=logp)
        carried = torch.full_like(logp, -math.inf).scatter_(-1, seen[..., None], 0.0)
        return Prediction(logits=torch.where((seen != self.mask_id)[..., None], carried, logp))

    def window_inputs(self, z: Tensor, positions: Tensor) -> Tensor:
        """The network inputs at ``positions`` of its own sequence: z[positions], or, shifted,
        z[positions - 1] with the BOS at 0 (network position L then holds z's last token)."""
        if self.shift_from is None:
            return z[:, positions]
        left = z[:, (positions - 1).clamp(min=0)]
        return torch.where(positions[None] == 0, self.shift_from, left)

    def network_length(self, length: int) -> int:
        """Positions of the network's sequence for a canvas of ``length`` (+1 for the BOS)."""
        return length + (self.shift_from is not None)


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
        self.time_sampler.attach(self.schedule)

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
        return MaskedDenoiser(network, self.mask_id, self.eos_id if self.shift else None)

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
        weight = self.weight(c.t)
        weight = weight[:, None] if weight.dim() == 1 else weight  # per sequence or per token
        per_masked = (nll * scored).sum(-1) / scored.sum(-1).clamp_min(1)
        return (weight * nll * scored).sum(-1), per_masked

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
        if self.training and self.ar_phase:
            if not self.shift:
                raise ValueError("an AR phase needs process.shift=true (next-token layout)")
            zeros = torch.zeros(tokens.shape[0], device=tokens.device)
            return next_token_loss(denoiser(tokens, zeros, subs=False).logits, tokens, valid)
        t = self.sample_t(tokens.shape[0], generator, device=tokens.device, length=tokens.shape[1])
        c = self.corrupt(tokens, t, generator)
        prompt = prompt_of(batch)
        if prompt is not None:
            c = hold_tokens(c, prompt, self.mask_id)
        integrand, per_masked = self.elbo(denoiser, c, valid)
        nats = integrand.sum() / valid.sum().clamp_min(1)
        observation = None
        if self.training and t.dim() == 1:  # a learned time sampler sees one level per row
            seen = (c.noisy & valid).any(-1)  # a row without masks says nothing about its level
            u = (t - self.t_min) / (1.0 - self.t_min)  # the time sampler's own units
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
