"""ReMDM: remasking masked diffusion (Wang et al. 2025, "Remasking Discrete Diffusion Models
with Inference-Time Scaling", eq. 7 and Sec. 4.1), a step rule that may remask tokens it has
committed, so that later steps can revise them.

One step t -> s with clean shares alpha_t = keep(t) <= alpha_s = keep(s) and a remasking
probability sigma_t <= (1 - alpha_s) / alpha_t:

* a committed token is remasked with probability sigma_t, else kept;
* a masked position is unmasked with probability (alpha_s - (1 - sigma_t) alpha_t) /
  (1 - alpha_t), its token drawn from the prediction.

sigma_t = 0 is MDLM's ancestral step. The schedules of sigma_t (``schedule``):

* ``cap``: sigma_t = min(eta, (1 - alpha_s) / alpha_t);
* ``rescale``: sigma_t = eta * min(1, (1 - alpha_s) / alpha_t), eta in [0, 1];
* ``conf``: sigma_t = softmax(c)_i * min(1, (1 - alpha_s) / alpha_t) per committed position i,
  c_i = -p_theta(x_i) at the step that committed it: the least confident are remasked first
  (``eta`` unused);
* ``loop``: alpha rises linearly from 0 at t = 1 to ``alpha_on`` at ``t_on`` (ancestral), stays
  at ``alpha_on`` down to ``t_off`` while each step remasks with sigma_t = eta and unmasks as
  many back (alpha_t = alpha_s = alpha_on), then rises linearly to 1 at t = 0 (ancestral).

The last step (s = 0) ends at alpha_s = 1: sigma_t = 0 and everything left is unmasked, so no
final denoising call is needed (the reference code's ``noise_removal``, which takes the argmax
at t = 1e-5 with one more call), and in the loop schedule a last step inside the loop phase
goes straight to 1. Reference code:
kuleshov-group/remdm, ``diffusion.py: _ddpm_caching_update`` at commit f830d659.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from cdlm import rng
from cdlm.samplers.base import categorical_at, register
from cdlm.samplers.masked_steps import Interval
from cdlm.samplers.rules import Rule, Window

SCHEDULES = ("cap", "rescale", "conf", "loop")


@dataclass
class Remasking:
    """One ReMDM step's probabilities, float64 (B, W): ``unmask`` at masked positions,
    ``remask`` at committed ones (0 elsewhere)."""

    unmask: Tensor
    remask: Tensor


def sigma_max(alpha_t: float, alpha_s: float) -> float:
    """min(1, (1 - alpha_s) / alpha_t): the most remasking that leaves a valid step (1 at
    alpha_t = 0, where nothing is committed yet)."""
    return 1.0 if alpha_t <= 0 else min(1.0, (1.0 - alpha_s) / alpha_t)


@register("remdm", processes=("masked", "block"))
@dataclass(frozen=True)
class ReMDM(Rule):
    """ReMDM (see the module docstring). schedule: cap | rescale | conf | loop; eta: the
    remasking strength (cap, rescale, loop); t_on, t_off, alpha_on: the loop phase;
    temperature: of the token draws."""

    revises: ClassVar[bool] = True
    schedule: str = "cap"
    eta: float = 0.008
    t_on: float = 0.55
    t_off: float = 0.05
    alpha_on: float = 0.9
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if not self.eta >= 0 or (self.schedule == "rescale" and self.eta > 1):
            raise ValueError(f"eta must be >= 0 (<= 1 with schedule=rescale), got {self.eta}")
        if self.schedule == "loop":
            if not (0 < self.t_off < self.t_on < 1 and 0 < self.alpha_on < 1):
                raise ValueError(
                    "schedule=loop needs 0 < t_off < t_on < 1 and 0 < alpha_on < 1, got "
                    f"t_on={self.t_on}, t_off={self.t_off}, alpha_on={self.alpha_on}"
                )
            if self.eta > (1 - self.alpha_on) / self.alpha_on:
                raise ValueError(
                    f"schedule=loop needs eta <= (1 - alpha_on) / alpha_on = "
                    f"{(1 - self.alpha_on) / self.alpha_on:.4g}, got {self.eta}"
                )

    def memo(self, x: Tensor) -> Tensor | None:
        """conf: each position's confidence score c_i (-inf until committed)."""
        if self.schedule != "conf":
            return None
        return torch.full(x.shape, -torch.inf, dtype=torch.float64, device=x.device)

    def looping(self, iv: Interval) -> bool:
        """Whether the step is in the loop phase: t_off < t <= t_on, and not the last step."""
        return self.schedule == "loop" and self.t_off < iv.t <= self.t_on and iv.s > 0

    def alphas(self, iv: Interval) -> tuple[float, float]:
        """alpha_t, alpha_s of the step: the mask schedule's, or the loop schedule's piece that
        t lies on (as the reference code chooses it). The last step (s = 0) ends at alpha = 1,
        so it unmasks everything left."""
        if self.schedule != "loop":
            return iv.keep_t, 1.0 if iv.s <= 0 else iv.keep_s
        if self.t_off < iv.t <= self.t_on:
            alpha_t, alpha_s = self.alpha_on, self.alpha_on
        elif iv.t > self.t_on:
            rise = self.alpha_on / (1 - self.t_on)
            alpha_t, alpha_s = (1 - iv.t) * rise, (1 - iv.s) * rise
        else:
            fall = (1 - self.alpha_on) / self.t_off
            alpha_t, alpha_s = 1 - iv.t * fall, 1 - iv.s * fall
        return alpha_t, 1.0 if iv.s <= 0 else alpha_s

    def probabilities(self, w: Window, iv: Interval) -> Remasking:
        """The step's unmask and remask probabilities (float64, B x W)."""
        alpha_t, alpha_s = self.alphas(iv)
        done = w.done
        if self.schedule == "conf":
            scores = w.memo.masked_fill(~done, -torch.inf)
            share = scores.softmax(-1).nan_to_num(0.0)  # a row with nothing committed: 0
            sigma = share * sigma_max(alpha_t, alpha_s)
        else:
            s = SIGMAS[self.schedule](self, alpha_t, alpha_s, iv)
            sigma = torch.full(w.x.shape, s, dtype=torch.float64, device=w.x.device)
        unmask = (alpha_s - (1 - sigma) * alpha_t) / (1 - alpha_t)
        zero = torch.zeros_like(sigma)
        return Remasking(unmask=torch.where(w.open_, unmask, zero), remask=sigma.where(done, zero))

    def step(self, w: Window, iv: Interval, generator: torch.Generator | None) -> Tensor:
        """One uniform per position decides unmask or remask; the unmasked draw their tokens."""
        p = self.probabilities(w, iv)
        u = rng.rand(w.x.shape, generator, device=w.x.device, dtype=torch.float64)
        unmask, remask = u < p.unmask, u < p.remask
        x = w.x.clone()
        x[unmask] = categorical_at(w.logp, unmask, generator, self.temperature)
        x[remask] = w.mask_id
        if w.memo is not None:  # conf: remember how sure the prediction was of each new token
            token = torch.where(unmask, x, 0)[..., None]  # [MASK] may lie outside the logits
            drawn = w.logp.gather(-1, token).squeeze(-1).double().exp()
            w.memo[unmask] = -drawn[unmask]
            w.memo[remask] = -torch.inf
        return x


def _cap(rule: ReMDM, alpha_t: float, alpha_s: float, iv: Interval) -> float:
    """ReMDM-cap: sigma_t = min(eta, (1 - alpha_s) / alpha_t) (eta where alpha_t = 0)."""
    return rule.eta if alpha_t <= 0 else min(rule.eta, (1 - alpha_s) / alpha_t)


def _rescale(rule: ReMDM, alpha_t: float, alpha_s: float, iv: Interval) -> float:
    """ReMDM-rescale: sigma_t = eta * sigma_max."""
    return rule.eta * sigma_max(alpha_t, alpha_s)


def _loop(rule: ReMDM, alpha_t: float, alpha_s: float, iv: Interval) -> float:
    """ReMDM-loop: eta inside the loop phase, 0 (ancestral) outside it."""
    return rule.eta if rule.looping(iv) else 0.0


# the position-independent sigma_t of each schedule (conf's is per position: ``probabilities``)
SIGMAS = {"cap": _cap, "rescale": _rescale, "loop": _loop}
