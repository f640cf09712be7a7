"""Gaussian diffusion over learned token embeddings (Diffusion-LM, Li et al. 2022; CDCD,
Dieleman et al. 2022; Plaid, Gulrajani & Hashimoto 2023).

Tokens map to embeddings x0 = E[w] (learned, each row normalised to norm ``scale * sqrt(dim)`` so
that the signal has a fixed size against unit-variance noise and cannot grow to escape it). The
forward process is variance-preserving in continuous time: x_t = alpha(t) x0 + sigma(t) eps.

Objectives:
  * ``ce`` (default, CDCD): the network outputs token logits; the loss is their cross-entropy and
    the denoised estimate is the expected embedding softmax(logits) @ E.
  * ``mse`` (Diffusion-LM): the network outputs x0 directly; the loss is ||x0_hat - x0||^2 plus the
    rounding term -log p(w | x0) with x0 drawn from q(x0 | w) at the lowest noise level.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import (
    ClampToEmbeddings,
    Denoiser,
    EmbeddingDenoiser,
    Prediction,
    SelfConditioned,
    per_position,
    readout_evidence,
)
from cdlm.evaluation.oracle import markov_marginals
from cdlm.processes.base import AttentionPhases, LevelMetrics, LossOutput, level_metrics
from cdlm.schedules import CosineSchedule, Schedule
from cdlm.time_samplers import TimeSampler, stratified_times

OBJECTIVES = ("ce", "mse")


class NormalizedEmbedding(nn.Module):
    """Learned token embeddings with every row rescaled to norm ``scale * sqrt(dim)``."""

    def __init__(self, vocab_size: int, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, dim))
        self.dim, self.scale = dim, scale

    def table(self) -> Tensor:
        """(V, D) normalised embedding table."""
        return F.normalize(self.weight, dim=-1) * (self.scale * math.sqrt(self.dim))

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, L) token ids -> (B, L, D) embeddings."""
        return self.table()[tokens]

    def logits(self, x: Tensor) -> Tensor:
        """Nearest-embedding readout, (B, L, D) -> (B, L, V): -||x - e_v||^2 / 2 up to a constant
        per position (rows share one norm), so its argmax is the nearest embedding. Always fp32:
        under bf16 autocast the inner products (up to dim) would be rounded by ~0.1, and the
        readout skip multiplies them by alpha / sigma^2."""
        with torch.autocast(x.device.type, enabled=False):
            return x.float() @ self.table().float().T

    def nearest(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, L) ids of the nearest embeddings."""
        return self.logits(x).argmax(-1)


class HoldFixed:
    """Replaces the fixed positions of x_t by the correctly noised ground truth
    alpha(t) x0 + sigma(t) noise before each call, and the prediction there by the truth
    (replacement-based inpainting, Song et al. 2021, App. I.2; Diffusion-LM infilling)."""

    def __init__(
        self,
        denoiser: Denoiser,
        schedule: Schedule,
        ids: Tensor,
        fixed: Tensor,
        x0: Tensor,
        noise: Tensor,
    ) -> None:
        self.denoiser, self.schedule, self.fixed = denoiser, schedule, fixed[..., None]
        self.ids, self.x0, self.noise = ids, x0, noise

    def __call__(self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None) -> Prediction:
        alpha, sigma = per_position(self.schedule.alpha(t)), per_position(self.schedule.sigma(t))
        held = (alpha * self.x0 + sigma * self.noise).to(x_t.dtype)
        pred = self.denoiser(torch.where(self.fixed, held, x_t), t, self_cond)
        x0 = torch.where(self.fixed, self.x0.to(pred.x0.dtype), pred.x0)
        onehot = torch.full_like(pred.logits, -1e9).scatter_(-1, self.ids[..., None], 0.0)
        return Prediction(logits=torch.where(self.fixed, onehot, pred.logits), x0=x0)


class GaussianProcess(AttentionPhases, nn.Module):
    """Continuous-time VP diffusion over normalised token embeddings.

    Args:
        vocab_size: tokenizer size (filled in from the data at build time).
        embed_dim: diffusion space dimension; small values (16-128) keep tokens confusable under
            moderate noise, which is where the model must learn to use context.
        schedule: a ``cdlm.schedules.Schedule``.
        objective: ``ce`` (CDCD) or ``mse`` (Diffusion-LM x0-MSE + rounding).
        embed_scale: multiplies the embedding norm sqrt(embed_dim).
        self_cond_prob: probability per training batch of self-conditioning.
        time_sampler: where training draws t (``cdlm.time_samplers``; default stratified
            uniform). Validation always draws stratified uniform t.
        readout_skip: add the no-context Bayes readout of x_t to the network's logits
            (``ce`` objective only; see ``EmbeddingDenoiser``).
        token_noise: share of training sequences whose tokens each draw their own noise level
            t ~ U(0, 1) instead of sharing one: some tokens hidden beside readable ones, as in
            masked diffusion, which is where using context pays (needs ``readout_skip`` or
            ``posterior_input``, which tell the network each token's own level).
        posterior_input: the network reads each position's no-context posterior over tokens
            (a soft token) instead of x_t, through a token-input network (Bayesian Flow
            Networks' input; see ``EmbeddingDenoiser``). ``ce`` objective, no self-conditioning.
        shift: Dream-style shifted prediction after a BOS = ``eos_id`` (needs
            ``posterior_input``): the layout of a next-token predictor, so AR weights apply.
        eos_id: the BOS id of the shifted input (filled in from the tokenizer).
        ar_steps, anneal_steps: train the first ``ar_steps`` batches as a next-token predictor
            on clean tokens (causal attention; needs ``shift``), then open attention from causal
            to full over ``anneal_steps`` batches (as ``MaskedProcess``; DiffuLLaMA, Dream).
    """

    kind = "gaussian"
    default_sampler = "ddpm"  # a conf/sampler/ name

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 64,
        schedule: Schedule | None = None,
        objective: str = "ce",
        embed_scale: float = 1.0,
        self_cond_prob: float = 0.5,
        time_sampler: TimeSampler | None = None,
        readout_skip: bool = False,
        token_noise: float = 0.0,
        posterior_input: bool = False,
        shift: bool = False,
        eos_id: int | None = None,
        ar_steps: int = 0,
        anneal_steps: int = 0,
    ) -> None:
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
        if readout_skip and objective != "ce":
            raise ValueError(
                "readout_skip needs objective=ce (it adds to the logits); with objective=mse set "
                "process.readout_skip=false"
            )
        if posterior_input and (objective != "ce" or self_cond_prob > 0):
            raise ValueError(
                "posterior_input needs objective=ce and self_cond_prob=0 (its network reads "
                "tokens, with no self-conditioning input)"
            )
        if shift and (not posterior_input or eos_id is None):
            raise ValueError("shift=true needs posterior_input=true and eos_id (the BOS)")
        if not 0.0 <= self_cond_prob <= 1.0:
            raise ValueError(f"self_cond_prob must be in [0, 1], got {self_cond_prob}")
        self.vocab_size, self.embed_dim = vocab_size, embed_dim
        self.schedule = schedule if schedule is not None else CosineSchedule()
        self.objective, self.self_cond_prob = objective, self_cond_prob
        self.embedding = NormalizedEmbedding(vocab_size, embed_dim, embed_scale)
        self.time_sampler = time_sampler if time_sampler is not None else TimeSampler()
        if not 0.0 <= token_noise <= 1.0:
            raise ValueError(f"token_noise must be in [0, 1], got {token_noise}")
        if token_noise > 0 and not (readout_skip or posterior_input):
            raise ValueError(
                "token_noise > 0 needs readout_skip=true or posterior_input=true (per-token levels)"
            )
        self.readout_skip, self.token_noise = readout_skip, token_noise
        self.posterior_input, self.shift, self.eos_id = posterior_input, shift, eos_id
        self._init_phases(ar_steps, anneal_steps, shift)

    @property
    def network_kwargs(self) -> dict:
        """The network's input/output widths this process needs."""
        if self.posterior_input:
            return {
                "in_vocab": self.vocab_size,
                "out_dim": self.vocab_size,
                "self_condition": False,
            }
        out_dim = self.vocab_size if self.objective == "ce" else self.embed_dim
        return {"in_dim": self.embed_dim, "out_dim": out_dim}

    def make_denoiser(self, network: nn.Module, temperature: float = 1.0) -> Denoiser:
        return EmbeddingDenoiser(
            network,
            self.embedding,
            self.objective == "ce",
            self.schedule,
            readout_skip=self.readout_skip,
            posterior_input=self.posterior_input,
            shift_from=self.eos_id if self.shift else None,
            temperature=temperature,
        )

    def sampling_denoiser(
        self, network: nn.Module, clamp: bool = False, condition=None, temperature: float = 1.0
    ) -> Denoiser:
        """The denoiser samplers see: ``condition`` (guidance, fixed regions) around the
        network's denoiser (its logits at ``temperature``), then self-conditioned on its previous
        estimate, optionally clamped. Stateful, so make one per sampling run."""
        denoiser = self.make_denoiser(network, temperature)
        denoiser = SelfConditioned(denoiser if condition is None else condition(denoiser))
        return ClampToEmbeddings(denoiser, self.embedding) if clamp else denoiser

    def start(
        self,
        x: Tensor,
        ids: Tensor,
        editable: Tensor,
        seeded: Tensor,
        strength: float,
        generator,
    ) -> Tensor:
        """The sampler's starting state for a canvas (B, L) of ``ids``: with strength < 1
        (editing), the ``seeded`` editable positions (text to edit) start from their embeddings
        noised to t = strength; blanks and everything else from the prior draw ``x``. Fixed
        positions are held by ``hold_fixed``."""
        if strength >= 1.0:
            return x
        x0 = self.embedding(ids).to(x.dtype)
        noise = torch.randn(x.shape, device=x.device, generator=generator, dtype=x.dtype)
        tt = torch.full((x.shape[0],), strength, device=x.device, dtype=x.dtype)
        return torch.where((editable & seeded)[..., None], self.corrupt(x0, tt, noise), x)

    def hold_fixed(self, denoiser: Denoiser, ids: Tensor, editable: Tensor, generator) -> Denoiser:
        """Holds the non-editable positions of ``ids`` (B, L) at their ground truth: the network
        sees them noised to the current level at every step (one noise draw for the run, so an
        ODE trajectory stays deterministic), and their x0 estimate and logits are the truth."""
        x0 = self.embedding(ids).detach()
        noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
        return HoldFixed(denoiser, self.schedule, ids, ~editable, x0, noise)

    def corrupt(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = alpha(t) x0 + sigma(t) noise; x0, noise: (B, L, D); t: (B,) or per token (B, L)."""
        alpha, sigma = self.schedule.alpha(t), self.schedule.sigma(t)
        return per_position(alpha) * x0 + per_position(sigma) * noise

    def prior(
        self, shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
    ) -> Tensor:
        """x_1 ~ N(0, I), (B, L, D)."""
        return torch.randn(*shape, self.embed_dim, device=device, generator=generator)

    def _predict(self, denoiser: Denoiser, x_t: Tensor, t: Tensor, self_cond: bool) -> Prediction:
        """One training/eval prediction; with self-conditioning, a first gradient-free pass
        supplies the estimate the second pass is conditioned on (Chen et al. 2022)."""
        estimate = None
        if self_cond:
            with torch.no_grad():
                estimate = denoiser(x_t, t).x0.detach()
        return denoiser(x_t, t, estimate)

    def loss(self, denoiser: Denoiser, tokens: Tensor) -> LossOutput:
        """tokens: (B, L). Returns the objective averaged over positions; in the AR phase of
        training, the next-token NLL of clean input under causal attention."""
        n = tokens.shape[0]
        if self.training and self._training_phase(denoiser):
            bos = torch.full_like(tokens[:, :1], self.eos_id)
            zeros = torch.zeros(n, device=tokens.device)
            label = getattr(denoiser, "label", None)  # set by WithLabel in labelled runs
            logits = denoiser.network(torch.cat([bos, tokens], 1), zeros, label=label)[:, :-1]
            nats = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
            return LossOutput(nats, {"ar_bits_per_token": nats.detach() / math.log(2)})
        t = (
            self.time_sampler(n, tokens.device)
            if self.training
            else stratified_times(n, tokens.device)
        )
        per_token = torch.zeros(n, dtype=torch.bool, device=tokens.device)
        if self.training and self.token_noise > 0:
            # These rows draw one level per token: hidden tokens beside readable ones, the
            # situation that teaches a masked model to use context.
            per_token = torch.rand(n, device=tokens.device) < self.token_noise
            own = torch.rand(tokens.shape, device=tokens.device)
            t = torch.where(per_token[:, None], own, t[:, None].expand_as(own))
        x0 = self.embedding(tokens)
        x_t = self.corrupt(x0, t, torch.randn_like(x0))
        self_cond = self.training and random.random() < self.self_cond_prob
        pred = self._predict(denoiser, x_t, t, self_cond)
        token_ce = F.cross_entropy(
            pred.logits.float().flatten(0, 1), tokens.flatten(), reduction="none"
        ).view_as(tokens)
        if self.training:
            shared = ~per_token
            level = t if t.dim() == 1 else t[:, 0]
            self.time_sampler.observe(level[shared], token_ce.mean(-1)[shared])
        ce = token_ce.mean()
        if self.objective == "ce":
            return LossOutput(ce, {"ce": ce.detach()})
        mse = (pred.x0.float() - x0.float()).pow(2).sum(-1).mean()
        x_low = self.corrupt(x0, torch.zeros_like(t), torch.randn_like(x0))
        rounding = F.cross_entropy(self.embedding.logits(x_low).flatten(0, 1), tokens.flatten())
        metrics = {"ce": ce.detach(), "mse": mse.detach(), "rounding": rounding.detach()}
        return LossOutput(mse + rounding, metrics)

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
        """Model CE/accuracy at a fixed noise level t, with self-conditioning if trained with it.

        With the unigram ``log_prior`` (V,) it also scores the no-context readout: the Bayes
        posterior over tokens given only the position's own noisy embedding,
        log p(v | x_t) = log prior_v + alpha <x_t, e_v> / sigma^2 + const (rows share one norm).
        At low noise this readout is near perfect, so only the gap to it shows context use.
        With a bigram ``transition`` (V, V) as well, it scores the exact bigram denoiser
        (``cdlm.evaluation.oracle``): what context can add at this level.
        """
        x0 = self.embedding(tokens)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator)
        tt = torch.full((tokens.shape[0],), t, device=tokens.device)
        x_t = self.corrupt(x0, tt, noise)
        pred = self._predict(denoiser, x_t, tt, self.self_cond_prob > 0)
        baseline = oracle = None
        if log_prior is not None:
            evidence = readout_evidence(self.embedding, self.schedule, x_t, tt)
            baseline = (evidence + log_prior.float()).flatten(0, 1)
            if transition is not None:
                marginals = markov_marginals(evidence, transition, log_prior.exp())
                oracle = marginals.clamp_min(1e-30).log().flatten(0, 1)
        return level_metrics(pred.logits.flatten(0, 1), tokens.flatten(), baseline, oracle)
