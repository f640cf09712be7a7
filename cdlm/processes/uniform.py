"""Uniform-state discrete diffusion: UDLM (Schiff et al. 2025) and Duo (Sahoo et al., ICML 2025,
"The Diffusion Duality").

Each token stays itself with probability alpha(t) and is otherwise replaced by a token drawn
uniformly from the K tokens the data can hold (``cdlm.processes.uniform_support``: by default the
tokenizer's ordinary tokens and the specials the data packs, EOS in text; the reference draws from
all ``len(tokenizer)`` ids, which ``process.excluded=[]`` restores). The marginal is
q(x_t | x) = Cat(alpha x + (1 - alpha) / K) over the support, the prior is uniform noise over it,
and any position may change at any step of decoding. With x_bar = K alpha x + (1 - alpha) (and
x_bar_theta the same with the model's x0 estimate in place of x), the continuous-time ELBO per
position, at the token i = x_t, is (Duo eq. 11 with its V the support's K; the reference's
``DUO_BASE.nll_per_token`` in another form):

    alpha' / (K alpha) [ K / x_bar_i - K / x_bar_theta_i
                         - sum_j (x_bar_j / x_bar_i) log(x_bar_theta_i x_bar_j / (x_bar_theta_j x_bar_i)) ]

which is >= 0 (alpha' < 0) and 0 when x_bar_theta = x_bar. The network reads time (its level
is not in the input, unlike masking's count of masks) unless ``time_conditioning=False``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from cdlm import rng
from cdlm.denoiser import Denoiser
from cdlm.processes.base import Corrupted, LevelEval, LossOutput
from cdlm.processes.complement import with_uniform_complement
from cdlm.processes.curriculum import GaussianCurriculum, Relaxed
from cdlm.processes.duality import argmax_pair, draw_runner, logsnr_of_alpha
from cdlm.processes.losses import check_levers, valid_mask
from cdlm.processes.prompts import hold_tokens, prompt_of
from cdlm.processes.token_process import TokenProcess
from cdlm.processes.uniform_bound import uniform_nelbo
from cdlm.processes.uniform_denoiser import HoldTokens, UniformDenoiser
from cdlm.processes.uniform_support import NoiseSupport, UniformNoise
from cdlm.schedules import LogLinearMaskSchedule, MaskSchedule
from cdlm.time_samplers import TimeSampler, bounded_times


class UniformProcess(TokenProcess):
    """Uniform-state diffusion over token ids.

    Args:
        vocab_size: tokenizer size (filled in from the data at build time).
        excluded: ids noise never draws and x0_hat never predicts (filled in from the data: the
            specials its rows never hold); empty, the default: the whole vocabulary.
        schedule: alpha(t) as a ``cdlm.schedules.MaskSchedule`` (keep(t); log-linear as Duo's
            ``noise=log-linear``, cosine, or ``cdlm.processes.duality.DualSchedule``).
        t_min: smallest training time (the ELBO weight alpha'/alpha grows towards alpha = 0).
        time_sampler: where training draws t; evaluation uses stratified uniform t.
        curriculum: Duo's Gaussian curriculum (``cdlm.processes.curriculum``): relaxed inputs
            for a share of training; off by default. Evaluation always uses the exact corruption.
        importance_weight, flat_weight, complementary: the training levers of
            ``MaskedProcess``; the flat weight divides the integrand by |alpha'/alpha|.
        time_conditioning: whether the network reads the level (False: it reads 0).
    """

    kind = "uniform"
    default_sampler = "duo_ancestral"
    loss_is_bound = True  # in eval mode the loss is the continuous-time ELBO (prior term ~0)
    exact_likelihood = False
    noise_levels = True
    sequential = False
    trains_on_prompts = True  # the prompt is held clean (``hold_tokens``), as sampling holds it
    causal = False
    canvas_id = None

    def __init__(
        self,
        vocab_size: int,
        schedule: MaskSchedule | None = None,
        t_min: float = 1e-3,
        time_sampler: TimeSampler | None = None,
        curriculum: GaussianCurriculum | None = None,
        importance_weight: bool = False,
        flat_weight: bool = False,
        complementary: bool = False,
        time_conditioning: bool = True,
        excluded: Sequence[int] = (),
    ) -> None:
        super().__init__()
        schedule = schedule if schedule is not None else LogLinearMaskSchedule()
        if not isinstance(schedule, MaskSchedule):
            raise ValueError(
                f"process=uniform needs an alpha(t) schedule (mask_schedule=loglinear or "
                f"mask_schedule=cosine), got {type(schedule).__name__}"
            )
        self.vocab_size, self.schedule, self.t_min = vocab_size, schedule, t_min
        self.support = NoiseSupport(vocab_size, excluded)
        self.time_sampler = time_sampler if time_sampler is not None else TimeSampler()
        self.time_sampler.attach(self.schedule)
        self.curriculum = curriculum if curriculum is not None else GaussianCurriculum()
        self.importance_weight, self.flat_weight = importance_weight, flat_weight
        self.complementary, self.time_conditioning = complementary, time_conditioning
        check_levers(self.time_sampler, importance_weight, complementary)
        if complementary and self.curriculum.share > 0:
            raise ValueError(
                "process.complementary applies to the exact corruption: set "
                "process.curriculum.share=0 (the curriculum's relaxed input has no complement)"
            )

    def set_progress(self, progress: float) -> None:
        """The time sampler's and the curriculum's share of the budget spent."""
        super().set_progress(progress)
        self.curriculum.set_progress(progress)

    def grid_schedule(self) -> nn.Module:
        return self.schedule

    @property
    def uniform_noise(self) -> UniformNoise:
        """alpha(t) and the support: an exact denoiser reads each x_t as evidence
        alpha [v = x_t] + (1 - alpha) / K (``cdlm.worlds.uniform``)."""
        return UniformNoise(self.schedule, self.support)

    def make_denoiser(self, network: nn.Module) -> Denoiser:
        return UniformDenoiser(network, self.time_conditioning, self.support)

    def keep(self, t: Tensor) -> Tensor:
        """alpha(t) shaped to (B, L) tokens: t is (B,) or per token (B, L)."""
        keep = self.schedule.keep(t)
        return keep[:, None] if keep.dim() == 1 else keep

    def noised(self, tokens: Tensor, keep: Tensor, generator) -> tuple[Tensor, Tensor]:
        """(x_t, resampled): each token kept with probability ``keep``, else a uniform draw
        from the support."""
        u = rng.rand(tokens.shape, generator, device=tokens.device)
        noise = self.support.draw(tokens.shape, generator, tokens.device)
        resampled = u >= keep
        return torch.where(resampled, noise, tokens), resampled

    def corrupt(
        self, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None
    ) -> Corrupted:
        """``noisy`` marks the resampled positions (a draw may land on the token itself)."""
        z, resampled = self.noised(tokens, self.keep(t), generator)
        return Corrupted(tokens=tokens, x0=tokens, x_t=z, t=t, noisy=resampled)

    def trajectory(
        self, tokens: Tensor, t: Tensor, s: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """(x_t, x_s), each (B, L): this process's corruptions at t and s (B,) made from ONE
        Gaussian path over one-hots (the duality, ``cdlm.processes.duality``), so they share
        their noise: the deterministic DDIM trajectory given ``tokens`` that Duo's consistency
        distillation (Sec. 5) walks. Each level's logsnr is the one whose argmax keeps a token
        with probability keep(t); the argmaxes come from ``draw_runner`` in O(B L)."""
        k = self.support.size  # the Gaussian lives on the support's K one-hots
        mu_t, mu_s = (torch.exp(0.5 * logsnr_of_alpha(self.keep(v), k)) for v in (t, s))
        own, runner, runner_at = draw_runner(self.support.index[tokens], k, generator)
        return argmax_pair(tokens, mu_t, mu_s, own, runner, self.support.ids[runner_at])

    def weight(self, t: Tensor) -> Tensor:
        """The ELBO's factor alpha'(t) / (K alpha(t)) before the bracket (module docstring)."""
        return self.schedule.dkeep(t) / (self.support.size * self.schedule.keep(t))

    def integrand(
        self, logp: Tensor, x_t: Tensor, x0: Tensor, keep: Tensor, dkeep: Tensor
    ) -> Tensor:
        """(B, L) the NELBO integrand (``uniform_nelbo``); with ``flat_weight`` in training,
        divided by |alpha' / alpha|, the ELBO's time weight: the bracket over V, whose scale
        is the ELBO's (dividing by K too would multiply the loss by the support's size)."""
        per = uniform_nelbo(logp, x_t, x0, keep, dkeep, self.support.mask)
        if not (self.training and self.flat_weight):
            return per
        factor = (dkeep.double() / keep.double()).abs()
        return per / (factor if factor.dim() == 2 else factor[:, None])

    def prior(
        self, shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
    ) -> Tensor:
        """Uniform noise over the support, (B, L), drawn from ``generator``."""
        return self.support.draw(shape, generator, device)

    def elbo_terms(self, logp: Tensor, c: Corrupted, valid: Tensor) -> Tensor:
        """(B,) the ELBO integrand summed over the valid positions, nats."""
        t = c.t
        per = self.integrand(logp, c.x_t, c.tokens, self.schedule.keep(t), self.schedule.dkeep(t))
        return (per * valid).sum(-1)

    def sample_t(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | None = None,
        length: int | None = None,
    ) -> Tensor:
        """Times in [t_min, 1): the time sampler's draw in training, stratified uniform in
        evaluation (the unbiased bound)."""
        return bounded_times(self.time_sampler, self.training, n, device, generator, self.t_min)

    def loss(self, denoiser: Denoiser, batch: dict[str, Tensor], generator=None) -> LossOutput:
        """The ELBO integrand in nats per valid token at t from ``sample_t``; inside the
        curriculum's share of training, at its relaxed input (``relax``). The network then reads
        softmax(w / tau) at the time of ``schedule`` with the mapped alpha (the reference
        conditions on -log alpha in both phases, so the level means one thing in both). A prompt
        (``cdlm.processes.prompts``) is held clean, as at sampling, and never scored."""
        tokens, valid = batch["tokens"], valid_mask(batch)
        self.support.check(tokens, valid)
        t = self.sample_t(tokens.shape[0], generator, device=tokens.device, length=tokens.shape[1])
        tau = 0.0  # the exact corruption is the tau -> 0 limit; logged every step, as Lightning
        # repeats a key's last value on steps that do not log it
        if self.training and self.curriculum.active():
            r, tau = self.relax(tokens, t, generator), self.curriculum.temperature()
            logp = denoiser(r.soft, self.schedule.time_of(r.keep)).logits
            per_row = (self.integrand(logp, r.x_t, tokens, r.keep, r.dkeep) * valid).sum(-1)
        else:
            c = self.corrupt(tokens, t, generator)
            if self.training and self.complementary:
                c = with_uniform_complement(c, self.schedule, self.support, self.t_min, generator)
                valid = valid.repeat(2, 1)
            prompt = prompt_of(batch)
            if prompt is not None:  # never dropped here (check_prompts): no blank to show
                c = hold_tokens(c, prompt.repeat(len(c.t) // len(t)), blank_id=0)
            logp = denoiser(c.x_t, c.t).logits
            per_row = self.elbo_terms(logp, c, valid)
        if self.training and self.importance_weight:
            per_row = per_row / self.time_sampler.density((t - self.t_min) / (1.0 - self.t_min))
        nats = (per_row.sum() / valid.sum().clamp_min(1)).to(logp.dtype)
        bits = nats.detach() / math.log(2)
        return LossOutput(nats, {"bits_per_token": bits, "curriculum_tau": torch.tensor(tau)})

    def check_prompts(self, prompt_dropout: float) -> None:
        """Also refuses prompt dropout (the uniform prior has no blank to show a dropped prompt
        as) and the curriculum (its relaxed input would show the prompt noised)."""
        super().check_prompts(prompt_dropout)
        if prompt_dropout > 0:
            raise ValueError(
                "condition.prompt_dropout > 0 is not supported by process=uniform: its prior has "
                "no blank to show a dropped prompt as"
            )
        if self.curriculum.share > 0:
            raise ValueError(
                "data.format=pairs is not supported with process.curriculum.share > 0: the "
                "curriculum's relaxed input does not hold the prompt clean"
            )

    def relax(self, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Relaxed:
        """The curriculum's relaxed corruption of ``tokens`` (B, L) at its times t (B,), with a
        fresh (B, L, V) Gaussian draw from ``generator``."""
        shape = (*tokens.shape, self.vocab_size)
        noise = torch.randn(shape, device=tokens.device, generator=generator)
        return self.curriculum.relax(tokens, t, noise, self.support.mask)

    @torch.no_grad()
    def evaluate_at(
        self, denoiser: Denoiser, tokens: Tensor, t: float | Tensor, generator=None
    ) -> LevelEval:
        """The model's log-probabilities at level t (a float, (B,) or (B, L)), scored on the
        resampled positions, beside each position's own evidence log q(x_t | x0 = v) =
        log(alpha [v = x_t] + (1 - alpha) / K)."""
        if not torch.is_tensor(t):
            t = torch.full((tokens.shape[0],), float(t), device=tokens.device)
        c = self.corrupt(tokens, t, generator)
        logits = denoiser(c.x_t, c.t).logits
        a = self.keep(t).to(logits.dtype)[..., None]
        same = nn.functional.one_hot(c.x_t, self.vocab_size).to(logits.dtype)
        evidence = torch.log(a * same + (1 - a) / self.support.size)
        return LevelEval(logits, tokens, c.noisy, evidence)

    def start(
        self, x: Tensor, ids: Tensor, editable: Tensor, seeded: Tensor, strength: float, generator
    ) -> Tensor:
        """The fixed tokens of ``ids``, the prior draw ``x`` on the editable positions; with
        strength < 1 (editing) each ``seeded`` editable position is ``ids`` noised to t =
        strength."""
        canvas = torch.where(editable, x, ids)
        if strength >= 1.0:
            return canvas
        keep = self.schedule.keep(torch.tensor(strength, device=ids.device))
        edited, _ = self.noised(ids, keep, generator)
        return torch.where(editable & seeded, edited, canvas)

    def hold_fixed(self, denoiser: Denoiser, ids: Tensor, editable: Tensor, generator) -> Denoiser:
        return HoldTokens(denoiser, ids, ~editable)
