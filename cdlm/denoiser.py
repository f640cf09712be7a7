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


def readout_evidence(embedding: nn.Module, schedule: nn.Module, x_t: Tensor, t: Tensor) -> Tensor:
    """(B, L, V) fp32 log-likelihood of each token given only its own noisy embedding x_t,
    alpha(t) / sigma(t)^2 <x_t, e_v> (exact up to a constant per position: rows share one
    norm); t: (B,) or per token (B, L)."""
    tt = t.float()
    gain = schedule.alpha(tt) / schedule.sigma(tt) ** 2
    return per_position(gain) * embedding.logits(x_t)


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

    Both options below use the no-context evidence of x_t (``readout_evidence``), hence the
    ``schedule``.

    With ``readout_skip`` (logits only) the network's logits are added to that evidence. Like the
    skip connection of EDM's preconditioning (Karras et al. 2022, Sec. 5), it gives the network
    the part of the answer that needs no context for free, so that training signal goes to
    context from the first step instead of to re-learning the embedding readout.

    With ``posterior_input`` the network reads, at each position, the posterior over tokens that
    the evidence gives (uniform prior) instead of x_t: a distribution over ids, embedded as its
    expected input embedding. This is the input of Bayesian Flow Networks (Graves et al. 2023):
    a readable token looks like a clean token and a hidden one like a soft [MASK], so the network
    faces a masked-LM-like task, and an AR network's weights apply unchanged. ``shift_from`` (a
    BOS id) then reads position i's prediction from output i - 1, as Dream's shifted masked
    prediction does.

    ``temperature`` (sampling only) divides the logits before the x0 estimate is formed: below 1
    the estimate moves from the posterior mean embedding towards the most likely token's.
    """

    def __init__(
        self,
        network: nn.Module,
        embedding: nn.Module,
        predicts_logits: bool,
        schedule: nn.Module | None = None,
        readout_skip: bool = False,
        posterior_input: bool = False,
        shift_from: int | None = None,
        temperature: float = 1.0,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if (readout_skip or posterior_input) and schedule is None:
            raise ValueError("readout_skip and posterior_input need the noise schedule")
        if shift_from is not None and not posterior_input:
            raise ValueError("shifted prediction needs posterior_input (token-like input)")
        self.network, self.embedding, self.predicts_logits = network, embedding, predicts_logits
        self.schedule, self.readout_skip, self.posterior_input = (
            schedule,
            readout_skip,
            posterior_input,
        )
        self.shift_from, self.temperature = shift_from, temperature

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, label: Tensor | None = None
    ) -> Prediction:
        # Per-token noise levels (B, L) condition the network through their sequence mean; the
        # evidence uses each token's own level.
        t_seq = t if t.dim() == 1 else t.mean(-1)
        evidence = None
        if self.readout_skip or self.posterior_input:
            evidence = readout_evidence(self.embedding, self.schedule, x_t, t)
        inputs = torch.softmax(evidence, dim=-1) if self.posterior_input else x_t
        if self.shift_from is not None:
            bos = torch.zeros_like(inputs[:, :1])
            bos[..., self.shift_from] = 1.0
            inputs = torch.cat([bos, inputs], dim=1)
        out = self.network(inputs, t_seq, self_cond, label=label)
        if self.shift_from is not None:
            out = out[:, :-1]
        if self.predicts_logits:
            logits = out.float()
            if self.readout_skip:
                logits = logits + evidence
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
