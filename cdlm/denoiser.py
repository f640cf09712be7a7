"""The denoiser contract shared by training, samplers, guidance and distillation.

A denoiser is any callable ``denoiser(x_t, t, self_cond=None, **kwargs) -> Prediction``. The
keywords reach the network unchanged: ``label`` (class ids), ``cache`` (the network's KV cache,
``cdlm.networks.cache``) and ``positions`` (absolute positions of the columns of x_t, for a
block or window of a longer canvas). Every wrapper passes on what it does not use, so a new
keyword reaches the network without touching the wrappers between. Parameterisation and
self-conditioning live in small wrappers, so samplers stay ignorant of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn


@dataclass
class Prediction:
    """logits: (B, L, V) token logits (log-probabilities for masked diffusion); x0: (B, L, D)
    estimate of the clean embeddings (embedding diffusion only)."""

    logits: Tensor
    x0: Tensor | None = None


def per_position(v: Tensor) -> Tensor:
    """A noise-level quantity per sequence (B,) or per token (B, L), shaped to scale (B, L, D)."""
    return v[:, None, None] if v.dim() == 1 else v[..., None]


def full_precision(x: Tensor) -> Tensor:
    """Upcasts bf16/fp16 network outputs (under autocast) for softmax and losses; keeps float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def readout_evidence(embedding: nn.Module, schedule: nn.Module, x_t: Tensor, t: Tensor) -> Tensor:
    """(B, L, V) fp32 log-likelihood of each token given only its own noisy embedding x_t,
    alpha(t) / sigma(t)^2 <x_t, e_v> (exact up to a constant per position: rows share one
    norm); t: (B,) or per token (B, L)."""
    tt = t.float()
    gain = schedule.alpha(tt) / schedule.sigma(tt) ** 2
    return per_position(gain) * embedding.logits(x_t)


def expected_embedding(logits: Tensor, embedding: nn.Module) -> Tensor:
    """softmax(logits) @ E: the posterior-mean embedding of a logits prediction (CDCD's x0)."""
    return torch.softmax(logits, dim=-1) @ embedding.table().to(logits.dtype)


class Denoiser(Protocol):
    def __call__(
        self,
        x_t: Tensor,
        t: Tensor,
        self_cond: Tensor | None = None,
        *,
        label: Tensor | None = None,
        cache: Any = None,
        positions: Tensor | None = None,
    ) -> Prediction: ...


def columns(v: Tensor, positions: Tensor | None) -> Tensor:
    """The columns of a whole-canvas tensor (B, L, ...) that a windowed call works on: all of
    them without ``positions``, else those at ``positions`` ((W,) or (B, W))."""
    if positions is None:
        return v
    if positions.dim() == 1:
        return v[:, positions]
    index = positions.view(*positions.shape, *([1] * (v.dim() - 2))).expand(
        *positions.shape, *v.shape[2:]
    )
    return v.gather(1, index)


def mixing_passes(scale: float) -> int:
    """Network passes per call of a guided mix uncond + scale (cond - uncond): one at 0 and 1,
    where the mix is one of its two predictions, else both."""
    return 1 if scale in (0.0, 1.0) else 2


class NetworkDenoiser:
    """Base of the denoisers that own a network: the calls of the denoiser contract beyond
    ``__call__``, with the defaults of a plain network. Samplers ask for them through these
    methods (and wrappers forward them), never by reaching for ``network``."""

    network: nn.Module

    def new_cache(self) -> Any:
        """An empty KV cache of the network (``cdlm.networks.cache``)."""
        return self.network.new_cache()

    def new_fixed_cache(self, batch: int, length: int, graph: bool = False) -> Any:
        """A fixed-shape KV cache of the network for ``batch`` rows of ``length`` positions,
        whose one-token decode step a CUDA graph can capture (``graph``;
        ``cdlm.networks.fixed_cache``)."""
        return self.network.new_fixed_cache(batch, length, graph)

    def network_length(self, length: int) -> int:
        """Positions the network runs for a canvas of ``length`` (a shifted layout adds one)."""
        return length

    def window_positions(self, positions: Tensor) -> Tensor:
        """The network positions a window call for the canvas ``positions`` runs: the same,
        unless the layout adds some (a shifted block's tail, ``cdlm.processes.block``)."""
        return positions

    def known_prefix(self) -> Tensor | None:
        """The leading tokens fixed in every row (B, P), which a cached sampler may prefill in
        one call; None when nothing is held fixed."""
        return None

    def prefix_lengths(self) -> Tensor | None:
        """(B,) each row's count of leading fixed tokens (its own prompt, where rows differ);
        None when nothing is held fixed."""
        return None

    def held_tokens(self) -> tuple[Tensor, Tensor] | None:
        """(ids (B, L), fixed (B, L) bool): canvas tokens a sampler that may revise any position
        (uniform-state diffusion) must leave in place; None when nothing is held."""
        return None

    def next_token_logits(self, tokens: Tensor, **kwargs) -> Tensor:
        """Next-token logits (B, L, V) of the clean ``tokens`` under causal attention, row i
        predicting tokens[:, i]: for denoisers with a next-token layout (an AR phase)."""
        raise ValueError(f"{type(self).__name__} has no next-token layout")


class Wrapper:
    """Base of denoiser wrappers that add behaviour to ``self.denoiser``. They forward the
    contract's calls (not its attributes): a wrapper that changes what a call means overrides
    that call too."""

    denoiser: Denoiser

    def new_cache(self) -> Any:
        return self.denoiser.new_cache()

    def new_fixed_cache(self, batch: int, length: int, graph: bool = False) -> Any:
        return self.denoiser.new_fixed_cache(batch, length, graph)

    def network_length(self, length: int) -> int:
        return self.denoiser.network_length(length)

    def window_positions(self, positions: Tensor) -> Tensor:
        return self.denoiser.window_positions(positions)

    def known_prefix(self) -> Tensor | None:
        return self.denoiser.known_prefix()

    def prefix_lengths(self) -> Tensor | None:
        return self.denoiser.prefix_lengths()

    def held_tokens(self) -> tuple[Tensor, Tensor] | None:
        return self.denoiser.held_tokens()

    def next_token_logits(self, tokens: Tensor, **kwargs) -> Tensor:
        return self.denoiser.next_token_logits(tokens, **kwargs)

    def shift(self, tokens: Tensor) -> Tensor:
        """The inputs of a next-token predictor for ``tokens`` (AR denoisers only)."""
        return self.denoiser.shift(tokens)

    def parameterize(self, out: Tensor, seen: Tensor, subs: bool = True) -> Prediction:
        """A masked denoiser's readout of raw network outputs (no network call)."""
        return self.denoiser.parameterize(out, seen, subs)


class SelfConditioned(Wrapper):
    """Feeds each call the x0 estimate of the previous call (sampling-time self-conditioning,
    Chen et al. 2022). Stateful by design: make one per sampling run. The estimate is kept
    only while calls keep the same shape (a windowed call starts afresh)."""

    def __init__(self, denoiser: Denoiser) -> None:
        self.denoiser = denoiser
        self.previous: Tensor | None = None

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, **kwargs
    ) -> Prediction:
        if self_cond is None and self.previous is not None:
            same = self.previous.shape[:2] == x_t.shape[:2]
            self_cond = self.previous if same else None
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        self.previous = pred.x0
        return pred


class SelfCondGuided(Wrapper):
    """Self-conditioning guidance (ELF, Hu et al. 2026): the prediction with the previous
    estimate and the one without it (the network's zero input, as trained for the unconditioned
    share of batches), mixed as classifier-free guidance, uncond + scale (cond - uncond), on the
    logits and the x0 estimate. Two network passes per call once an estimate exists; scale 1 is
    plain self-conditioning, 0 none. Sits inside ``SelfConditioned``, which supplies it."""

    def __init__(self, denoiser: Denoiser, scale: float) -> None:
        if scale < 0:
            raise ValueError(f"self_cond_scale must be >= 0, got {scale}")
        self.denoiser, self.scale = denoiser, float(scale)

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, **kwargs
    ) -> Prediction:
        if self_cond is None or self.scale == 1.0:
            return self.denoiser(x_t, t, self_cond, **kwargs)
        uncond = self.denoiser(x_t, t, None, **kwargs)
        if self.scale == 0.0:
            return uncond
        cond = self.denoiser(x_t, t, self_cond, **kwargs)
        w = self.scale
        logits = (uncond.logits + w * (cond.logits - uncond.logits)).log_softmax(-1)
        return Prediction(logits=logits, x0=uncond.x0 + w * (cond.x0 - uncond.x0))


class ClampToEmbeddings(Wrapper):
    """Replaces the x0 estimate by the embedding of its argmax token at every step
    (the "clamping trick" of Diffusion-LM, Li et al. 2022, Sec. 4.2)."""

    def __init__(self, denoiser: Denoiser, embedding: nn.Module) -> None:
        self.denoiser, self.embedding = denoiser, embedding

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, **kwargs
    ) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        x0 = self.embedding(pred.logits.argmax(-1)).to(pred.x0.dtype)
        return Prediction(x0=x0, logits=pred.logits)


class HoldFixed(Wrapper):
    """Replaces the fixed positions of x_t by the correctly noised ground truth
    alpha(t) x0 + sigma(t) noise before each call, and the prediction there by the truth
    (replacement-based inpainting, Song et al. 2021, App. I.2; Diffusion-LM infilling). With
    ``positions`` the call covers those columns of the canvas only."""

    def __init__(
        self,
        denoiser: Denoiser,
        schedule,
        ids: Tensor,
        fixed: Tensor,
        x0: Tensor,
        noise: Tensor,
    ) -> None:
        self.denoiser, self.schedule, self.fixed = denoiser, schedule, fixed[..., None]
        self.ids, self.x0, self.noise = ids, x0, noise

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        at = kwargs.get("positions")
        fixed, ids, x0 = (columns(v, at) for v in (self.fixed, self.ids, self.x0))
        alpha, sigma = per_position(self.schedule.alpha(t)), per_position(self.schedule.sigma(t))
        held = (alpha * x0 + sigma * columns(self.noise, at)).to(x_t.dtype)
        pred = self.denoiser(torch.where(fixed, held, x_t), t, self_cond, **kwargs)
        x0_hat = torch.where(fixed, x0.to(pred.x0.dtype), pred.x0)
        onehot = torch.full_like(pred.logits, -1e9).scatter_(-1, ids[..., None], 0.0)
        return Prediction(logits=torch.where(fixed, onehot, pred.logits), x0=x0_hat)


class Unpadded(Wrapper):
    """Rows of different canvas lengths in one batch, padded on the right to the longest: every
    call tells the network each row's real length (``lengths``, in the network's positions), so
    no query attends to padding and a row computes what it would alone."""

    def __init__(self, denoiser: Denoiser, lengths: list[int], device: torch.device) -> None:
        self.denoiser = denoiser
        own = [denoiser.network_length(n) for n in lengths]
        self.lengths = torch.tensor(own, device=device)

    def __call__(self, x: Tensor, *args, **kwargs) -> Prediction:
        # guidance stacks the unconditional half below the batch: the same rows again
        lengths = self.lengths.repeat(max(1, x.shape[0] // self.lengths.shape[0]))
        return self.denoiser(x, *args, lengths=lengths, **kwargs)
