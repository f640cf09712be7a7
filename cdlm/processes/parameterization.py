"""How an embedding-diffusion network reads x_t and how its output becomes a ``Prediction``.

The pieces compose instead of interlocking flags, each chosen in the config by ``_target_``:

* an **input** (``VectorInput``: the network reads x_t, optionally self-conditioned; or
  ``PosteriorInput``: it reads each position's no-context posterior over tokens, optionally with
  Dream-style shifted prediction);
* an **objective** (``cdlm.processes.objectives``): the network's output (logits or x0), loss;
* **prediction wrappers** (``ReadoutSkip``, ``Temperature``, ``ExpectedEmbedding``,
  ``NearestReadout``): denoisers around denoisers, where a piece acts on predictions;
* **prediction pieces** (``XPrediction``, ``PreconditionSkip``; ``process.prediction``): each
  widens the output, wraps the denoiser inside (``wrap``) or outside (``wrap_outer``) the
  objective's wrappers, and adds a loss term.
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
    per_position,
    readout_evidence,
)


class VectorInput:
    """The network reads x_t itself, (B, L, D); with ``self_cond_prob`` > 0 training
    self-conditions that share of batches on a first pass's x0 estimate (Chen et al. 2022), and
    sampling feeds each step the previous estimate."""

    sees_token_levels = False  # x_t alone does not tell the network each token's own level
    shift = False

    def __init__(self, self_cond_prob: float = 0.0) -> None:
        if not 0.0 <= self_cond_prob <= 1.0:
            raise ValueError(f"self_cond_prob must be in [0, 1], got {self_cond_prob}")
        self.self_cond_prob = self_cond_prob

    def network_kwargs(self, vocab_size: int, embed_dim: int) -> dict:
        return {"in_dim": embed_dim, "self_condition": self.self_cond_prob > 0}

    def __call__(self, x_t: Tensor, t: Tensor, embedding: nn.Module, schedule) -> Tensor:
        return x_t


class PosteriorInput:
    """The network reads, at each position, the posterior over tokens that the position's own
    x_t gives (uniform prior), embedded as its expected input embedding: the input of Bayesian
    Flow Networks (Graves et al. 2023). A readable token looks like a clean token and a hidden
    one like a soft [MASK], so the task is masked-LM-like and AR weights apply unchanged.

    ``shift``: position i's prediction is read from output i - 1 of [BOS, inputs] (Dream, Ye et
    al. 2025), the layout of a next-token predictor; the process supplies the BOS id.
    """

    sees_token_levels = True
    self_cond_prob = 0.0

    def __init__(self, shift: bool = False, bos_id: int | None = None) -> None:
        self.shift, self.bos_id = shift, bos_id

    def network_kwargs(self, vocab_size: int, embed_dim: int) -> dict:
        return {"in_vocab": vocab_size, "self_condition": False}

    def __call__(self, x_t: Tensor, t: Tensor, embedding: nn.Module, schedule) -> Tensor:
        soft = torch.softmax(readout_evidence(embedding, schedule, x_t, t), dim=-1)
        if not self.shift:
            return soft
        bos = torch.zeros_like(soft[:, :1])
        bos[..., self.bos_id] = 1.0
        return torch.cat([bos, soft], dim=1)


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
        t_seq = t if t.dim() == 1 else t.mean(-1)
        out = self.network(
            self.input(x_t, t, self.embedding, self.schedule), t_seq, self_cond, **kwargs
        )
        if self.input.shift:
            out = out[:, :-1]
        if self.output == "logits":
            return Prediction(logits=full_precision(out))
        return Prediction(logits=None, x0=out.to(x_t.dtype))

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


class _SplitX0(Wrapper):
    """The last ``dim`` output columns as a free x0, the rest as the logits."""

    def __init__(self, denoiser: Denoiser, dim: int) -> None:
        self.denoiser, self.dim = denoiser, dim

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        out = self.denoiser(x_t, t, self_cond, **kwargs).logits
        return Prediction(logits=out[..., : -self.dim], x0=out[..., -self.dim :].to(x_t.dtype))


class _Skip(Wrapper):
    """x0 = c_skip(t) x_t + c_out(t) F(x_t, t) (EDM preconditioning in VP form)."""

    def __init__(self, denoiser: Denoiser, schedule, sigma_data: float) -> None:
        self.denoiser, self.schedule, self.sigma_data = denoiser, schedule, sigma_data

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        c_skip, c_out = map(per_position, skip_coefficients(self.schedule, t, self.sigma_data))
        return Prediction(logits=pred.logits, x0=(c_skip * x_t + c_out * pred.x0).to(x_t.dtype))


def skip_coefficients(schedule, t: Tensor, sigma_data: float) -> tuple[Tensor, Tensor]:
    """EDM's c_skip and c_out (Karras et al. 2022, Table 1) for x_t = alpha x0 + sigma eps with
    data std ``sigma_data``: the x0 estimate c_skip x_t + c_out F has unit-variance target F and
    is x_t's own best linear guess of x0 when F = 0."""
    alpha, sigma = schedule.alpha(t.float()), schedule.sigma(t.float())
    total = alpha**2 * sigma_data**2 + sigma**2
    return alpha * sigma_data**2 / total, sigma * sigma_data / total.sqrt()


class XPrediction:
    """A free x0 head beside the CE readout (ELF's x-prediction, Hu et al. 2026): the network
    outputs ``embed_dim`` more columns, read as the x0 estimate the samplers step with, not
    confined to the hull of the embeddings as softmax(logits) @ E is. Trained by ``weight``
    times ||x0_hat - x0||^2 (summed over the embedding, averaged over positions) beside the CE,
    which keeps the logits a readout."""

    def __init__(self, weight: float = 1.0) -> None:
        if weight <= 0:
            raise ValueError(f"x-prediction weight must be > 0, got {weight}")
        self.weight = weight

    def extra_out_dim(self, embed_dim: int) -> int:
        return embed_dim

    def wrap(self, denoiser: Denoiser, process) -> Denoiser:
        return _SplitX0(denoiser, process.embed_dim)

    def wrap_outer(self, denoiser: Denoiser, process) -> Denoiser:
        return denoiser

    def loss(self, pred: Prediction, c, valid: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        error = (pred.x0.float() - c.x0.float()).pow(2).sum(-1)
        mse = (error * valid).sum() / valid.sum().clamp_min(1)
        return self.weight * mse, {"x0_mse": mse.detach()}


class _ReadoutBase(Wrapper):
    """x0 = softmax(logits) @ E + sigma(t)^2 F, outside the objective's wrappers (so the logits
    carry the readout skip)."""

    def __init__(self, denoiser: Denoiser, embedding: nn.Module, schedule) -> None:
        self.denoiser, self.embedding, self.schedule = denoiser, embedding, schedule

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        pred = self.denoiser(x_t, t, self_cond, **kwargs)
        base = expected_embedding(pred.logits, self.embedding)
        gate = per_position(self.schedule.sigma(t.float()) ** 2)
        return Prediction(logits=pred.logits, x0=(base + gate * pred.x0).to(x_t.dtype))


class PreconditionSkip:
    """A skip on the x0 head, so that the network learns a correction, not x0 from scratch.

    ``base="x_t"``: EDM's preconditioning (Karras et al. 2022, Sec. 5; LangFlow's skip, Chen et
    al. 2026), x0 = c_skip x_t + c_out F, with ``sigma_data`` the per-dimension std of the
    embeddings (default: the process's ``embed_scale``). It needs a network that sees x_t: the
    noise in c_skip x_t is cancelled only by an F that reads it; the VDM bound weights x0 error
    by the SNR, so with the posterior input a token pays ~D/2 nats per unit of log-SNR.

    ``base="readout"``: x0 = softmax(logits) @ E + sigma(t)^2 F: the CE estimate at low noise
    (the bound's weight exp(logsnr) sigma^4 -> 0 keeps F out), free to leave the hull at high
    noise. Both need ``XPrediction`` before it."""

    def __init__(self, sigma_data: float | None = None, base: str = "x_t") -> None:
        if sigma_data is not None and sigma_data <= 0:
            raise ValueError(f"sigma_data must be > 0, got {sigma_data}")
        if base not in ("x_t", "readout"):
            raise ValueError(f"PreconditionSkip base must be 'x_t' or 'readout', got {base!r}")
        self.sigma_data, self.base = sigma_data, base

    def extra_out_dim(self, embed_dim: int) -> int:
        return 0

    def wrap(self, denoiser: Denoiser, process) -> Denoiser:
        if self.base == "readout":
            return denoiser
        sigma_data = self.sigma_data if self.sigma_data is not None else process.embedding.scale
        return _Skip(denoiser, process.schedule, sigma_data)

    def wrap_outer(self, denoiser: Denoiser, process) -> Denoiser:
        if self.base == "x_t":
            return denoiser
        return _ReadoutBase(denoiser, process.embedding, process.schedule)

    def loss(self, pred: Prediction, c, valid: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        return torch.zeros((), device=valid.device), {}


def check_pieces(pieces: list, objective) -> list:
    """The prediction pieces, checked: known classes, an x0 head only beside a logits
    objective, a skip only after an x0 head."""
    seen_head = False
    for piece in pieces:
        if not isinstance(piece, XPrediction | PreconditionSkip):
            raise ValueError(
                f"unknown prediction piece {piece!r}; valid: "
                "cdlm.processes.parameterization.XPrediction, PreconditionSkip"
            )
        if isinstance(piece, XPrediction):
            if objective.output != "logits" or seen_head:
                raise ValueError("XPrediction goes once, beside a logits objective (objective=ce)")
            seen_head = True
        elif not seen_head:
            raise ValueError(
                "PreconditionSkip needs an XPrediction before it in process.prediction"
            )
    return pieces
