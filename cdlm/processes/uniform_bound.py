"""The uniform-state continuous-time NELBO integrand (Duo eq. 11; ``cdlm.processes.uniform``'s
module docstring derives it), in a form with one (B, L, V) tensor."""

from __future__ import annotations

import torch
from torch import Tensor


def uniform_nelbo(
    logp: Tensor,
    x_t: Tensor,
    x0: Tensor,
    alpha: Tensor,
    dalpha: Tensor,
    support: Tensor | None = None,
) -> Tensor:
    """(B, L) the continuous-time NELBO integrand per position (module docstring), float64.

    logp: (B, L, V) the model's log x0-probabilities; x_t, x0: (B, L) ids; alpha, dalpha: the
    schedule's alpha(t) and alpha'(t), each (B,) or per token (B, L); support: (V,) bool, the K
    ids the noise draws from (``cdlm.processes.uniform_support``; None: all V), which hold
    x_t, x0 and logp's mass. x_bar takes two values only (K alpha + 1 - alpha at x0, 1 - alpha
    elsewhere on the support) and sums to K, so the sum over j reduces to sums of
    log x_bar_theta: one (B, L, V) tensor in ``logp``'s precision (fp32 in training, as the
    reference), everything after the sums over the support in float64."""
    vocab = logp.shape[-1] if support is None else support.sum()  # a tensor: no device sync
    alpha, dalpha = (v.double() if v.dim() == 2 else v.double()[:, None] for v in (alpha, dalpha))
    a = alpha.to(logp.dtype)[..., None]
    log_theta = torch.log(vocab * a * logp.exp() + (1 - a))  # log x_bar_theta, (B, L, V)
    theta_i = log_theta.gather(-1, x_t[..., None]).squeeze(-1).double()
    theta_x = log_theta.gather(-1, x0[..., None]).squeeze(-1).double()
    keep, peak = 1 - alpha, vocab * alpha + 1 - alpha  # x_bar off and at x0
    bar_i = torch.where(x_t == x0, peak, keep)
    bar_log_bar = (vocab - 1) * torch.xlogy(keep, keep) + peak * peak.log()  # sum_j x_j log x_j
    on = log_theta if support is None else log_theta.masked_fill(~support, 0.0)
    bar_log_theta = keep * on.sum(-1, dtype=torch.float64) + vocab * alpha * theta_x
    kl = (vocab * (theta_i - bar_i.log()) + bar_log_bar - bar_log_theta) / bar_i
    bracket = vocab / bar_i - vocab * torch.exp(-theta_i) - kl
    return dalpha / (vocab * alpha) * bracket
