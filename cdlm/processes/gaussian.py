"""Gaussian diffusion over learned token embeddings (Diffusion-LM, Li et al. 2022; CDCD,
Dieleman et al. 2022; Plaid, Gulrajani & Hashimoto 2023).

Tokens map to embeddings x0 = E[w] (``NormalizedEmbedding``: learned, rows of norm ``scale *
sqrt(dim)``), noised variance-preserving in continuous time: x_t = alpha(t) x0 + sigma(t) eps.
How the network reads x_t and what it predicts are pieces (``parameterization``, ``objectives``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm import rng
from cdlm.denoiser import (
    ClampToEmbeddings,
    Denoiser,
    Prediction,
    SelfCondGuided,
    SelfConditioned,
    per_position,
    readout_evidence,
)
from cdlm.networks.embedding import NormalizedEmbedding
from cdlm.processes.base import Corrupted, LevelEval, LossOutput, ProcessModule
from cdlm.processes.hybrid import HybridMasking, check_hybrid, hybrid_corrupt, hybrid_token_loss
from cdlm.processes.inputs import PosteriorInput, VectorInput
from cdlm.processes.losses import (
    level_observation,
    masked_mean,
    mean_hidden,
    next_token_loss,
    valid_mask,
)
from cdlm.processes.objectives import X0MSE, CrossEntropy
from cdlm.processes.parameterization import check_pieces, check_reading
from cdlm.processes.prompts import check_view, hold_embeddings, hold_view, prompt_of
from cdlm.processes.readouts import EmbeddingDenoiser
from cdlm.schedules import CosineSchedule, Schedule
from cdlm.time_samplers import TimeSampler, stratified_times

CLEAN_LEVEL = 0.05  # score_hidden: the noise level of the tokens around the hidden ones


class GaussianProcess(ProcessModule):
    """Continuous-time VP diffusion over normalised token embeddings.

    Args:
        vocab_size: tokenizer size (filled in from the data at build time).
        embed_dim: diffusion space dimension; small values (16-128) keep tokens confusable under
            moderate noise, which is where the model must learn to use context.
        schedule: a ``cdlm.schedules.Schedule``.
        embed_scale: multiplies the embedding norm sqrt(embed_dim).
        input: ``VectorInput`` (x_t, optionally self-conditioned; the default) or
            ``PosteriorInput`` (soft tokens, optionally shifted).
        objective: ``CrossEntropy`` (CDCD; the default) or ``X0MSE`` (Diffusion-LM).
        time_sampler: where training draws t (``cdlm.time_samplers``); evaluation: stratified.
        token_noise: share of training sequences whose tokens each draw their own level: hidden
            tokens beside readable ones, as in masked diffusion (needs ``PosteriorInput`` or
            ``CrossEntropy(readout_skip=True)``, which see each level).
        importance_weight: weight each token's CE by 1 / density(t) of the time sampler: the
            uniform-t objective whatever the proposal.
        prediction: pieces between network and objective (``XPrediction``, ``PreconditionSkip``).
        default_sampler: the conf/sampler/ name cdlm-sample uses when given none.
        hybrid: ``HybridMasking``: CANDI's corruption, Gaussian noise on a masking schedule's
            share of tokens and the rest clean anchors, with its loss (``cdlm.processes.hybrid``;
            sampler=hybrid).
        eos_id: the BOS of a shifted input and of the AR phase (filled in from the tokenizer).
        prompt_view: how fixed text reaches the network, in sampling and training alike
            (``cdlm.processes.prompts``): ``clean`` at level 0 (the config's default) or
            ``noised`` to the current level (the default of files from before the option).
    """

    kind = "gaussian"
    continuous = True
    loss_is_bound = False  # the CE objective is not a likelihood bound: see cdlm.likelihood
    exact_likelihood = False
    noise_levels = True
    sequential = False
    trains_on_prompts = True

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 64,
        schedule: Schedule | None = None,
        embed_scale: float = 1.0,
        input: VectorInput | PosteriorInput | None = None,
        objective: CrossEntropy | X0MSE | None = None,
        time_sampler: TimeSampler | None = None,
        token_noise: float = 0.0,
        importance_weight: bool = False,
        prediction: list | None = None,
        default_sampler: str = "ddpm",
        eos_id: int | None = None,
        hybrid: HybridMasking | None = None,
        prompt_view: str = "noised",
    ) -> None:
        super().__init__()
        self.prompt_view = check_view(prompt_view)
        self.input = input if input is not None else VectorInput()
        self.objective = objective if objective is not None else CrossEntropy()
        check_reading(self.input, self.objective, token_noise, eos_id)
        self.vocab_size, self.embed_dim, self.eos_id = vocab_size, embed_dim, eos_id
        self.schedule = schedule if schedule is not None else CosineSchedule()
        self.embedding = NormalizedEmbedding(vocab_size, embed_dim, embed_scale)
        self.time_sampler = time_sampler if time_sampler is not None else TimeSampler()
        self.time_sampler.attach(self.schedule)
        self.token_noise, self.importance_weight = token_noise, importance_weight
        if importance_weight and not isinstance(self.objective, CrossEntropy):
            raise ValueError("process.importance_weight applies to objective=ce")
        self.prediction = check_pieces(list(prediction or []), self.objective)
        self.default_sampler, self.hybrid = default_sampler, check_hybrid(self, hybrid)

    @property
    def self_conditions(self) -> bool:
        return self.input.self_cond_prob > 0

    def unmask_share(self, t: Tensor, s: Tensor) -> Tensor:
        """``HybridMasking.unmask_share`` (sampler=hybrid); refused without ``hybrid``."""
        if self.hybrid is None:
            raise ValueError("sampler=hybrid needs a model trained with process.hybrid (CANDI)")
        return self.hybrid.unmask_share(t, s)

    def grid_schedule(self) -> nn.Module:
        return self.schedule

    @torch.no_grad()
    def score_hidden(self, denoiser: Denoiser, ids: Tensor, hidden: Tensor) -> Tensor:
        """The hidden tokens at pure noise, the rest nearly clean (``CLEAN_LEVEL``): one seeded
        noise draw shared by every row, so a row's score does not depend on its batch."""
        t = torch.where(hidden, 1.0, CLEAN_LEVEL).to(ids.device)
        x0, g = self.embedding(ids), torch.Generator(ids.device).manual_seed(0)
        noise = torch.randn(x0.shape[1:], device=x0.device, generator=g, dtype=x0.dtype)
        x_t = self.noised(x0, t, noise.expand_as(x0))
        logp = self.predict(denoiser, x_t, t, self.self_conditions).logits.log_softmax(-1)
        return mean_hidden(logp, ids, hidden)

    @property
    def next_token_layout(self) -> bool:
        """Whether the network can be trained as a next-token predictor (an AR phase)."""
        return self.input.shift

    @property
    def network_kwargs(self) -> dict:
        """The network's input/output widths this process needs."""
        v, d = self.vocab_size, self.embed_dim
        out = self.objective.out_dim(v, d) + sum(p.extra_out_dim(d) for p in self.prediction)
        return self.input.network_kwargs(v, d) | {"out_dim": out}

    def make_denoiser(self, network: nn.Module, temperature: float = 1.0) -> Denoiser:
        base = EmbeddingDenoiser(
            network, self.input, self.embedding, self.schedule, self.objective.output
        )
        for piece in self.prediction:
            base = piece.wrap(base, self)
        denoiser = self.objective.wrap(base, self.embedding, self.schedule, temperature)
        for piece in self.prediction:
            denoiser = piece.wrap_outer(denoiser, self)
        return denoiser

    def sampling_denoiser(
        self,
        network: nn.Module,
        clamp: bool = False,
        condition=None,
        temperature: float = 1.0,
        self_cond_scale: float = 1.0,
    ) -> Denoiser:
        """The denoiser samplers see: ``condition`` (guidance, fixed regions) around the
        network's denoiser (its logits at ``temperature``), self-conditioned on its previous
        estimate (guided at ``self_cond_scale``: ``SelfCondGuided``), optionally clamped.
        Stateful, so make one per sampling run."""
        if self_cond_scale != 1.0 and self.input.self_cond_prob == 0:
            raise ValueError("self_cond_scale needs a model trained with self_cond_prob > 0")
        denoiser = self.make_denoiser(network, temperature)
        denoiser = denoiser if condition is None else condition(denoiser)
        denoiser = SelfConditioned(SelfCondGuided(denoiser, self_cond_scale))
        return ClampToEmbeddings(denoiser, self.embedding) if clamp else denoiser

    def start(
        self, x: Tensor, ids: Tensor, editable: Tensor, seeded: Tensor, strength: float, generator
    ) -> Tensor:
        """The sampler's starting state for a canvas (B, L) of ``ids``: with strength < 1
        (editing), the ``seeded`` editable positions (text to edit) start from their embeddings
        noised to t = strength; blanks and everything else from the prior draw ``x``. Fixed
        positions are held by ``hold_fixed``."""
        if strength >= 1.0:
            return x
        x0 = self.embedding(ids).to(x.dtype)
        noise = rng.randn(x.shape, generator, device=x.device, dtype=x.dtype)
        tt = torch.full((x.shape[0],), strength, device=x.device, dtype=x.dtype)
        return torch.where((editable & seeded)[..., None], self.noised(x0, tt, noise), x)

    def hold_fixed(self, denoiser: Denoiser, ids: Tensor, editable: Tensor, generator) -> Denoiser:
        """Holds the non-editable positions of ``ids`` (B, L) at their ground truth
        (``cdlm.processes.prompts.hold_view``: noised or clean, ``prompt_view``)."""
        x0 = self.embedding(ids).detach()
        return hold_view(denoiser, self.schedule, ids, ~editable, x0, self.prompt_view, generator)

    def noised(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = alpha(t) x0 + sigma(t) noise; x0, noise: (B, L, D); t: (B,) or per token (B, L)."""
        alpha, sigma = self.schedule.alpha(t), self.schedule.sigma(t)
        return per_position(alpha) * x0 + per_position(sigma) * noise

    def corrupt(
        self, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None
    ) -> Corrupted:
        """Embeds ``tokens`` (B, L) and noises them to ``t`` ((B,) or (B, L)); with ``hybrid``
        and t (B,), only its corrupted share (``hybrid_corrupt``); levels (B, L) are as given."""
        if self.hybrid is not None and t.dim() == 1:
            return hybrid_corrupt(self, tokens, t, generator)
        x0 = self.embedding(tokens)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
        noisy = torch.ones_like(tokens, dtype=torch.bool)
        return Corrupted(tokens, x0, self.noised(x0, t, noise), t, noisy, noise)

    def sample_t(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | None = None,
        length: int | None = None,
    ) -> Tensor:
        """Training (module in train mode): the time sampler's draw, with the ``token_noise``
        share of rows drawing one level per token ((n, length) then); evaluation: stratified
        uniform (n,)."""
        device = device if device is not None else getattr(generator, "device", None)
        if not self.training:
            return stratified_times(n, device, generator)
        t = self.time_sampler(n, device, generator)
        if self.token_noise == 0 or length is None:
            return t
        per_token = torch.rand(n, device=device, generator=generator) < self.token_noise
        own = self.time_sampler(n * length, device, generator)  # shuffled: strata not in order
        own = own[torch.randperm(n * length, device=device, generator=generator)].view(n, length)
        return torch.where(per_token[:, None], own, t[:, None].expand_as(own))

    def weight(self, t: Tensor) -> Tensor:
        """Both objectives weight every level alike (CDCD's CE; Diffusion-LM's x0-MSE)."""
        return torch.ones_like(t)

    def prior(self, shape: tuple[int, int], device: torch.device, generator: rng.Draws) -> Tensor:
        """x_1 ~ N(0, I), (B, L, D)."""
        return rng.randn((*shape, self.embed_dim), generator, device=device)

    def predict(self, denoiser: Denoiser, x_t: Tensor, t: Tensor, self_cond: bool) -> Prediction:
        """With self-conditioning, a gradient-free first pass gives the estimate (Chen 2022)."""
        estimate = None
        if self_cond:
            with torch.no_grad():
                estimate = denoiser(x_t, t).x0.detach()
        return denoiser(x_t, t, estimate)

    def loss(self, denoiser: Denoiser, batch: dict[str, Tensor], generator=None) -> LossOutput:
        """The objective averaged over valid positions (a prompt held as sampling holds one,
        ``prompts.hold_embeddings``, never scored); in an AR phase, the clean next-token NLL."""
        tokens, valid = batch["tokens"], valid_mask(batch)
        if self.training and self.ar_phase:
            if not self.next_token_layout:
                raise ValueError("an AR phase needs a shifted input (input=posterior shift=true)")
            return next_token_loss(denoiser.next_token_logits(tokens), tokens, valid)
        n, length = tokens.shape
        t = rows = self.sample_t(n, generator, device=tokens.device, length=length)
        c = self.corrupt(tokens, t, generator)
        if (prompt := prompt_of(batch)) is not None:
            c = hold_embeddings(c, prompt, generator, view=self.prompt_view, schedule=self.schedule)
            t = c.t
        coin = torch.rand((), device=tokens.device, generator=generator)
        self_cond = self.training and bool(coin < self.input.self_cond_prob)
        pred = self.predict(denoiser, c.x_t, c.t, self_cond)
        if self.hybrid is None:
            loss, metrics, ce_tokens = self.objective.loss(pred, c, valid, self, generator)
        else:  # CANDI's weighted CE of the corrupted tokens
            ce_tokens, metrics = hybrid_token_loss(self.hybrid, pred, c, rows), {}
            loss = masked_mean(ce_tokens, valid)
        if self.training and self.importance_weight:
            density = self.time_sampler.density(t).to(ce_tokens.dtype)
            loss = masked_mean(ce_tokens / per_position(density)[..., 0].clamp_min(1e-6), valid)
        for piece in self.prediction:
            term, more = piece.loss(pred, c, valid)
            loss, metrics = loss + term, metrics | more
        observation = level_observation(t, ce_tokens, valid) if self.training else None
        return LossOutput(loss, metrics, observation)

    @torch.no_grad()
    def evaluate_at(
        self, denoiser: Denoiser, tokens: Tensor, t: float | Tensor, generator=None
    ) -> LevelEval:
        """The model's logits at level t (a float, (B,) or per token (B, L)), with
        self-conditioning if trained with it, beside the no-context evidence of each position:
        log p(v | x_t) = alpha <x_t, e_v> / sigma^2 + const (rows share one norm). At low noise
        that readout is near perfect, so only the gap to it shows context use."""
        if not torch.is_tensor(t):
            t = torch.full((tokens.shape[0],), float(t), device=tokens.device)
        c = self.corrupt(tokens, t, generator)
        pred = self.predict(denoiser, c.x_t, c.t, self.self_conditions)
        evidence = readout_evidence(self.embedding, self.schedule, c.x_t, c.t)
        return LevelEval(pred.logits, tokens, c.noisy, evidence)
