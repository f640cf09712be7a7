"""The denoiser contract shared by training, samplers, guidance and distillation.

A denoiser is any callable ``denoiser(x_t, t, self_cond=None) -> Prediction``. Parameterisation and
self-conditioning live in small wrappers here, so samplers stay ignorant of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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


class Denoiser(Protocol):
    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, *, label=None
    ) -> Prediction: ...


class Wrapper:
    """Base of denoiser wrappers that add behaviour to ``self.denoiser``: any other attribute
    (e.g. the AR sampler's ``network`` and ``shift``) is the wrapped denoiser's."""

    denoiser: Denoiser

    def __getattr__(self, name: str):
        if name == "denoiser" or name.startswith("__"):  # not yet set (copy, pickle)
            raise AttributeError(name)
        return getattr(self.denoiser, name)


class EmbeddingDenoiser:
    """Wraps a network for embedding diffusion.

    With ``predicts_logits`` (CDCD) the network outputs token logits and x0 is the expected
    embedding softmax(logits) @ E; otherwise (Diffusion-LM) it outputs x0 and the logits are the
    nearest-embedding readout of that x0. A plain callable, not a module: it owns no parameters,
    so wrapping never registers the network's weights twice.

    With ``readout_skip`` (a schedule; logits only) the network's logits are added to the
    no-context Bayes readout of x_t, alpha(t) / sigma(t)^2 <x_t, e_v>: the exact log-likelihood
    of each token given only its own noisy embedding (rows share one norm). Like the skip
    connection of EDM's preconditioning (Karras et al. 2022, Sec. 5), it gives the network the
    part of the answer that needs no context for free, so that training signal goes to context
    from the first step instead of to re-learning the embedding readout.

    ``temperature`` (sampling only) divides the logits before the x0 estimate is formed: below 1
    the estimate moves from the posterior mean embedding towards the most likely token's.
    """

    def __init__(
        self,
        network: nn.Module,
        embedding: nn.Module,
        predicts_logits: bool,
        readout_skip: nn.Module | None = None,
        temperature: float = 1.0,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.network, self.embedding, self.predicts_logits = network, embedding, predicts_logits
        self.readout_skip, self.temperature = readout_skip, temperature

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, label: Tensor | None = None
    ) -> Prediction:
        # Per-token noise levels (B, L) condition the network through their sequence mean; the
        # readout skip uses each token's own level.
        t_seq = t if t.dim() == 1 else t.mean(-1)
        out = self.network(x_t, t_seq, self_cond, label=label)
        if self.predicts_logits:
            logits = out.float()
            if self.readout_skip is not None:
                tt = t.float()
                gain = self.readout_skip.alpha(tt) / self.readout_skip.sigma(tt) ** 2
                logits = logits + per_position(gain) * self.embedding.logits(x_t)
            logits = logits / self.temperature
            x0 = torch.softmax(logits, dim=-1) @ self.embedding.table().float()
            return Prediction(x0=x0.to(x_t.dtype), logits=logits)
        x0 = out.to(x_t.dtype)
        return Prediction(x0=x0, logits=self.embedding.logits(x0))


class SelfConditioned:
    """Feeds each call the x0 estimate of the previous call (sampling-time self-conditioning,
    Chen et al. 2022). Stateful by design: make one per sampling run."""

    def __init__(self, denoiser: Denoiser) -> None:
        self.denoiser = denoiser
        self.previous: Tensor | None = None

    def __call__(self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None) -> Prediction:
        pred = self.denoiser(x_t, t, self.previous if self_cond is None else self_cond)
        self.previous = pred.x0
        return pred


class ClampToEmbeddings:
    """Replaces the x0 estimate by the embedding of its argmax token at every step
    (the "clamping trick" of Diffusion-LM, Li et al. 2022, Sec. 4.2)."""

    def __init__(self, denoiser: Denoiser, embedding: nn.Module) -> None:
        self.denoiser, self.embedding = denoiser, embedding

    def __call__(self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond)
        x0 = self.embedding(pred.logits.argmax(-1)).to(pred.x0.dtype)
        return Prediction(x0=x0, logits=pred.logits)
