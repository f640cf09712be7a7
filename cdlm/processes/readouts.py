"""How an embedding-diffusion network's output becomes a ``Prediction`` (logits and x0).

``EmbeddingDenoiser`` runs the network behind its input piece (``cdlm.processes.inputs``) and
types the raw output; the wrappers are denoisers around denoisers that an objective
(``cdlm.processes.objectives``) stacks to fill in the rest: ``ReadoutSkip``, ``Temperature``,
``ExpectedEmbedding`` (logits -> x0), ``NearestReadout`` (x0 -> logits).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm.denoiser import (
    Denoiser,
    NetworkDenoiser,
    Prediction,
    Wrapper,
    expected_embedding,
    full_precision,
    readout_evidence,
)
from cdlm.processes.inputs import PosteriorInput, VectorInput


def sequence_level(t: Tensor, lengths: Tensor | None, shift: bool) -> Tensor:
    """(B,) the mean of per-token levels (B, L) that conditions the network: over each row's
    own positions where rows are padded (``lengths``: network positions, one more when
    ``shift``ed), so that a padded row is conditioned as it would be alone."""
    if lengths is None:
        return t.mean(-1)
    return torch.stack([t[b, : n - shift].mean() for b, n in enumerate(lengths.tolist())])


class EmbeddingDenoiser(NetworkDenoiser):
    """The network behind an input piece: (x_t, t) -> the raw output as a ``Prediction``
    (``logits`` for a logits objective, ``x0`` for an x0 objective; the objective's wrappers
    fill in the other). A plain callable, not a module: it owns no parameters, so wrapping never
    registers the network's weights twice. Per-token levels (B, L) condition the network
    through their sequence mean; the input piece sees each token's own level."""

    def __init__(
        self,
        network: nn.Module,
        input: VectorInput | PosteriorInput,
        embedding: nn.Module,
        schedule,
        output: str,
    ) -> None:
        self.network, self.input, self.embedding, self.schedule = (
            network,
            input,
            embedding,
            schedule,
        )
        self.output = output

    def __call__(
        self, x_t: Tensor, t: Tensor, self_cond: Tensor | None = None, **kwargs
    ) -> Prediction:
        t_seq = t if t.dim() == 1 else sequence_level(t, kwargs.get("lengths"), self.input.shift)
        x_in = self.input(x_t, t, self.embedding, self.schedule)
        out = self.network(x_in, t_seq, self.input.estimate(self_cond), **kwargs)
        if self.input.shift:
            out = out[:, :-1]
        if self.output == "logits":
            return Prediction(logits=full_precision(out))
        return Prediction(logits=None, x0=out.to(x_t.dtype))

    def network_length(self, length: int) -> int:
        """Positions the network runs for a canvas of ``length`` (+1 for a shifted input's BOS)."""
        return length + bool(self.input.shift)

    def next_token_logits(self, tokens: Tensor, **kwargs) -> Tensor:
        """The network on clean [BOS, x_0, ..., x_{L-1}] under causal attention (an AR phase of
        a shifted input): outputs 0..L-1, row i predicting tokens[:, i]."""
        if not self.input.shift:
            return super().next_token_logits(tokens, **kwargs)
        bos = torch.full_like(tokens[:, :1], self.input.bos_id)
        zeros = torch.zeros(tokens.shape[0], device=tokens.device)
        return self.network(torch.cat([bos, tokens], 1), zeros, **kwargs)[:, :-1]


class ReadoutSkip(Wrapper):
    """Adds the no-context evidence of x_t to the logits. Like the skip connection of EDM's
    preconditioning (Karras et al. 2022, Sec. 5), it gives the network the part of the answer
    that needs no context for free, so training signal goes to context from the first step."""

    def __init__(self, denoiser: Denoiser, embedding: nn.Module, schedule) -> None:
        self.denoiser, self.embedding, self.schedule = denoiser, embedding, schedule

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        evidence = readout_evidence(self.embedding, self.schedule, x_t, t)
        return Prediction(logits=pred.logits + evidence, x0=pred.x0)


class Temperature(Wrapper):
    """Divides the logits by ``temperature`` (sampling only): below 1 the x0 estimate formed
    from them moves from the posterior mean embedding towards the most likely token's."""

    def __init__(self, denoiser: Denoiser, temperature: float) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.denoiser, self.temperature = denoiser, temperature

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        return Prediction(logits=pred.logits / self.temperature, x0=pred.x0)


class ExpectedEmbedding(Wrapper):
    """x0 = softmax(logits) @ E: the posterior-mean embedding of a logits prediction (CDCD,
    Dieleman et al. 2022), unless an x0 head gave x0."""

    def __init__(self, denoiser: Denoiser, embedding: nn.Module) -> None:
        self.denoiser, self.embedding = denoiser, embedding

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        if pred.x0 is not None:  # a free x0 head (XPrediction) already gave one
            return pred
        x0 = expected_embedding(pred.logits, self.embedding)
        return Prediction(logits=pred.logits, x0=x0.to(x_t.dtype))


class NearestReadout(Wrapper):
    """Logits of an x0 prediction: the nearest-embedding readout (Diffusion-LM rounding)."""

    def __init__(self, denoiser: Denoiser, embedding: nn.Module) -> None:
        self.denoiser, self.embedding = denoiser, embedding

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        x0 = self.denoiser(x_t, t, self_cond, **kwargs).x0
        return Prediction(logits=self.embedding.logits(x0), x0=x0)
