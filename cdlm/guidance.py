"""Class conditioning and classifier-free guidance (Ho & Salimans 2022) as denoiser wrappers.

A class-conditional network takes a label per sequence; label -1 is "no label", the null
condition that training substitutes with probability ``dropout`` so that one network is both
conditional and unconditional. At sampling the ``Guided`` wrapper evaluates both and mixes them,
uncond + w (cond - uncond), in the space each process predicts in: token logits (masked, AR) and
the x0 estimate (gaussian). It is itself a denoiser, so samplers know nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser, Prediction, Wrapper

NO_LABEL = -1


class WithLabel(Wrapper):
    """Binds a label per sequence (B,) to a denoiser."""

    def __init__(self, denoiser: Denoiser, label: Tensor) -> None:
        self.denoiser, self.label = denoiser, label

    def __call__(self, x: Tensor, *args, **kwargs) -> Prediction:
        return self.denoiser(x, *args, label=self.label, **kwargs)


def drop_labels(label: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
    """Replaces each label by ``NO_LABEL`` with probability p (condition dropout)."""
    u = torch.rand(label.shape, device=label.device, generator=generator)
    return torch.where(u < p, NO_LABEL, label)


def _mix(cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
    """uncond + scale (cond - uncond) where both are finite; elsewhere cond (the -inf entries of
    masked diffusion's SUBS log-probabilities, and its carried-over positions, stay as they are)."""
    finite = torch.isfinite(cond) & torch.isfinite(uncond)
    mixed = uncond + scale * (cond - uncond)
    return torch.where(finite, mixed, cond)


class Guided(Wrapper):
    """Classifier-free guidance at scale w for one label per sequence.

    w = 0 is the unconditional model and w = 1 the conditional one (each one network pass, so
    both reproduce their unguided samples exactly); any other w runs the conditional and the
    unconditional pass as one batch of 2B and mixes them: logits (then renormalised) and, for
    embedding diffusion, the x0 estimate. ``passes`` is the network evaluations per call.
    """

    def __init__(self, denoiser: Denoiser, label: Tensor, scale: float) -> None:
        if scale < 0:
            raise ValueError(f"guidance scale must be >= 0, got {scale}")
        self.denoiser, self.label, self.scale = denoiser, label, float(scale)
        self.passes = 1 if self.scale in (0.0, 1.0) else 2

    def __call__(self, x: Tensor, t: Tensor | None = None, self_cond: Tensor | None = None, **kw):
        if self.passes == 1:
            label = self.label if self.scale == 1.0 else torch.full_like(self.label, NO_LABEL)
            return self.denoiser(x, t, self_cond, label=label, **kw)

        def twice(v: Tensor | None) -> Tensor | None:
            return None if v is None else torch.cat([v, v])

        label = torch.cat([self.label, torch.full_like(self.label, NO_LABEL)])
        pred = self.denoiser(twice(x), twice(t), twice(self_cond), label=label, **kw)
        cond, uncond = pred.logits.chunk(2)
        logits = _mix(cond, uncond, self.scale)
        logits = logits.masked_fill(~torch.isfinite(cond), -torch.inf).log_softmax(-1)
        x0 = None
        if pred.x0 is not None:
            x0_cond, x0_uncond = pred.x0.chunk(2)
            x0 = x0_uncond + self.scale * (x0_cond - x0_uncond)
        return Prediction(logits=logits, x0=x0)


@dataclass
class Guidance:
    """What to condition on at sampling: a label index for every sample, or one per sample
    (a list as long as the samples drawn), or None (unconditional); and the scale."""

    label: int | list[int] | None = None
    scale: float = 1.0

    def wrap(self, denoiser: Denoiser, batch: int, device: torch.device, first: int = 0):
        """The guided denoiser for samples ``first`` to ``first + batch``."""
        if self.label is None:
            return denoiser
        if isinstance(self.label, int):
            label = torch.full((batch,), self.label, dtype=torch.long, device=device)
        else:
            label = torch.tensor(self.label[first : first + batch], device=device)
        return Guided(denoiser, label, self.scale)
