"""CANDI's hybrid corruption for the gaussian process (Pynadath, Shi & Zhang 2026, "CANDI:
Hybrid Discrete-Continuous Diffusion Models").

Pure Gaussian noise destroys a token's identity (its nearest embedding) long before it destroys
the continuous signal, so at the levels where denoising is hard the network has no clean token
left to condition on. CANDI decouples the two corruptions: at time t each token is, independently,

* corrupted with probability r(t) = 1 - keep(t) of a masking schedule, and then carries its
  embedding Gaussian-noised to level t, alpha(t) e + sigma(t) eps (its level is t), or
* left clean, an anchor: exactly its embedding, at level 0.

Its loss is the masked-diffusion ELBO term over the corrupted tokens (MDLM's weight
-keep'(t) / (1 - keep(t)), 1/t for the log-linear schedule), which CANDI trains with:

    L = E_{t ~ U(0, 1)} E_{m, eps} [ w(t) sum_i m_i (-log p(x_i | z_t)) ] / (valid tokens).

It is that term of a bound only: the Gaussian values of the corrupted tokens are extra
conditioning whose own reverse-process terms it leaves out, so it is no likelihood bound (the
gaussian process keeps ``loss_is_bound = False``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.denoiser import Prediction, full_precision
from cdlm.processes.base import Corrupted
from cdlm.schedules import LogLinearMaskSchedule, MaskSchedule


class HybridMasking(nn.Module):
    """The discrete half of CANDI's corruption: which tokens the Gaussian noise reaches.

    Args:
        mask_schedule: ``keep(t)``, the probability that a token is a clean anchor at t
            (``conf/mask_schedule/``; log-linear by default, as CANDI's r(t) = t).
    """

    def __init__(self, mask_schedule: MaskSchedule | None = None) -> None:
        super().__init__()
        self.mask_schedule = mask_schedule if mask_schedule is not None else LogLinearMaskSchedule()

    def corrupted(self, t: Tensor, shape: torch.Size, generator=None) -> Tensor:
        """(B, L) bool: each token corrupted with probability 1 - keep(t); t: (B,)."""
        u = torch.rand(shape, device=t.device, generator=generator, dtype=torch.float64)
        return u < (1.0 - self.mask_schedule.keep(t.double()))[:, None]

    def weight(self, t: Tensor) -> Tensor:
        """MDLM's ELBO weight -keep'(t) / (1 - keep(t)) per row, (B,)."""
        keep = self.mask_schedule.keep(t)
        return -self.mask_schedule.dkeep(t) / (1.0 - keep).clamp_min(1e-12)

    def unmask_share(self, t: Tensor, s: Tensor) -> Tensor:
        """The probability that a token corrupted at t is clean at s < t, under the forward
        process: (keep(s) - keep(t)) / (1 - keep(t)); 1 at s = 0 (keep(0) = 1)."""
        keep_t, keep_s = self.mask_schedule.keep(t), self.mask_schedule.keep(s)
        return ((keep_s - keep_t) / (1.0 - keep_t).clamp_min(1e-12)).clamp(0.0, 1.0)


def hybrid_corrupt(
    process, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None
) -> Corrupted:
    """One draw of the hybrid corruption of ``tokens`` (B, L) at ``t`` (B,): corrupted tokens
    noised to t, anchors exact embeddings at level 0; ``Corrupted.t`` holds the (B, L) levels."""
    x0 = process.embedding(tokens)
    noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
    noisy = process.hybrid.corrupted(t, tokens.shape, generator)
    levels = torch.where(noisy, t[:, None], torch.zeros_like(t[:, None]))
    x_t = torch.where(noisy[..., None], process.noised(x0, levels, noise), x0)
    return Corrupted(tokens, x0, x_t, levels, noisy, noise)


def hybrid_token_loss(hybrid: HybridMasking, pred: Prediction, c: Corrupted, t: Tensor) -> Tensor:
    """(B, L) per-token terms of the hybrid loss: w(t) times the cross-entropy of each
    corrupted token, 0 at the anchors; ``t``: the rows' times (B,)."""
    logits = full_precision(pred.logits)
    ce = F.cross_entropy(logits.flatten(0, 1), c.tokens.flatten(), reduction="none")
    weight = hybrid.weight(t.to(logits.dtype))[:, None]
    return ce.view_as(c.tokens) * c.noisy * weight


def check_hybrid(process, hybrid: HybridMasking | None) -> HybridMasking | None:
    """``hybrid``, after refusing the pieces its loss does not combine with, each by name."""
    if hybrid is None:
        return None
    if process.token_noise > 0:
        raise ValueError(
            "process.hybrid draws each token's level itself: set process.token_noise=0"
        )
    if process.prediction:
        raise ValueError("process.hybrid takes no prediction pieces (process.prediction=[])")
    if not process.objective.output == "logits":
        raise ValueError("process.hybrid needs objective=ce (its loss is a token CE)")
    if not (process.input.sees_token_levels or process.objective.sees_token_levels):
        raise ValueError(
            "process.hybrid needs input=posterior or objective.readout_skip=true (pieces that "
            "tell the network which tokens are clean anchors)"
        )
    return hybrid
