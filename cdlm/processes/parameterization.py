"""Prediction pieces of an embedding-diffusion process (``process.prediction``), chosen in the
config by ``_target_``: each widens the network's output, wraps the denoiser inside (``wrap``)
or outside (``wrap_outer``) the objective's wrappers, and adds a loss term.

* ``XPrediction``: a free x0 head beside the CE readout;
* ``PreconditionSkip``: a skip on that head (EDM's c_skip x_t + c_out F, or the readout base).

``check_pieces`` refuses an order that cannot work; ``check_reading``, input and objective
pieces that do not fit. How the network reads x_t is
``cdlm.processes.inputs``; how its output becomes a ``Prediction``, ``cdlm.processes.readouts``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser, Prediction, Wrapper, expected_embedding, per_position
from cdlm.processes.inputs import PosteriorInput, VectorInput
from cdlm.processes.objectives import X0MSE, CrossEntropy


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


def check_reading(input, objective, token_noise: float, eos_id: int | None) -> None:
    """Refuses an unknown input or objective piece and a ``token_noise`` the pieces cannot read,
    each by name; hands a shifted input its BOS (``eos_id``)."""
    if not isinstance(objective, CrossEntropy | X0MSE):
        raise ValueError(f"unknown objective {objective!r}; valid: ce, mse (objective=ce)")
    if not isinstance(input, VectorInput | PosteriorInput):
        raise ValueError(f"unknown input {input!r}; valid: vector, posterior (input=vector)")
    if input.shift:
        if eos_id is None:
            raise ValueError("a shifted input needs eos_id (the BOS it starts with)")
        input.bos_id = eos_id
    if not 0.0 <= token_noise <= 1.0:
        raise ValueError(f"token_noise must be in [0, 1], got {token_noise}")
    if token_noise > 0 and not (input.sees_token_levels or objective.sees_token_levels):
        raise ValueError(
            "token_noise > 0 needs input=posterior or objective.readout_skip=true (pieces "
            "that tell the network each token's own level)"
        )
