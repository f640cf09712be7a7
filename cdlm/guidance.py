"""Class conditioning and classifier-free guidance (Ho & Salimans 2022) as denoiser wrappers.

A class-conditional network takes a label per sequence; label -1 is "no label", the null
condition that training substitutes with probability ``dropout`` so that one network is both
conditional and unconditional. At sampling the ``Guided`` wrapper evaluates both and mixes them,
uncond + w (cond - uncond), in the space each process predicts in: token logits (masked, AR) and
the x0 estimate (gaussian). It is itself a denoiser, so samplers know nothing of it.

Prompt guidance (LLaDA, Nie et al. 2025, App. B.3; Gen. CFG on the prompt) guides on the fixed
text instead of, or besides, the label: the unconditional pass sees the prompt positions at the
prior (masked for masked diffusion, pure noise at level 1 for gaussian), so w > 1 pushes the
generated text towards what the prompt implies. Any process whose network sees the whole canvas
takes it; the left-to-right baseline does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm.denoiser import Denoiser, Prediction, Wrapper, columns, mixing_passes

NO_LABEL = -1


class WithLabel(Wrapper):
    """Binds a label per sequence (B,) to a denoiser."""

    def __init__(self, denoiser: Denoiser, label: Tensor) -> None:
        self.denoiser, self.label = denoiser, label

    def __call__(self, x: Tensor, *args, **kwargs) -> Prediction:
        return self.denoiser(x, *args, label=self.labels_for(x.shape[0]), **kwargs)

    def labels_for(self, batch: int) -> Tensor:
        """The labels of a batch of ``batch`` rows: repeated when the batch was stacked on
        itself, as complementary masking stacks its complement below the corruption."""
        return self.label.repeat(max(1, batch // self.label.shape[0]))

    def next_token_logits(self, tokens: Tensor, **kwargs) -> Tensor:
        return self.denoiser.next_token_logits(tokens, label=self.label, **kwargs)

    def streams(self, z: Tensor, clean: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
        """Block diffusion's two-stream training call, with the label (repeated when the batch
        was stacked on itself, as complementary masking does)."""
        return self.denoiser.streams(z, clean, label=self.labels_for(z.shape[0]), **kwargs)


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
    """Classifier-free guidance at scale w, on a label per sequence, on the prompt, or both.

    ``label`` (B,): the conditional pass gets it and the unconditional pass ``NO_LABEL``.
    ``where`` (B, L) bool and ``blank`` (the prior's state there, (B, L) ids or (B, L, D)): the
    unconditional pass sees ``blank`` at the ``where`` positions, at level t = 1 (prompt
    guidance). w = 0 is the unconditional model and w = 1 the conditional one (each one network
    pass, so both reproduce their unguided samples exactly); any other w runs both passes as one
    batch of 2B and mixes them: logits (then renormalised) and, for embedding diffusion, the x0
    estimate. ``passes`` is the network evaluations per call.
    """

    def __init__(
        self,
        denoiser: Denoiser,
        label: Tensor | None,
        scale: float,
        where: Tensor | None = None,
        blank: Tensor | None = None,
    ) -> None:
        if scale < 0:
            raise ValueError(f"guidance scale must be >= 0, got {scale}")
        if label is None and where is None:
            raise ValueError("guidance needs a label or a prompt to guide on")
        if (where is None) != (blank is None):
            raise ValueError("prompt guidance needs both the prompt positions and their blank")
        self.denoiser, self.label, self.scale = denoiser, label, float(scale)
        self.where, self.blank = where, blank
        self.passes = mixing_passes(self.scale)

    def unconditional(self, x: Tensor, t: Tensor | None, kw: dict) -> tuple:
        """(x, t, keywords) of the unconditional pass: no label, the prompt at the prior."""
        if self.label is not None:
            kw = kw | {"label": torch.full_like(self.label, NO_LABEL)}
        if self.where is None:
            return x, t, kw
        at = kw.get("positions")
        # a windowed call may pass the whole canvas (masked) or only the window (gaussian)
        where, blank = (
            (self.where, self.blank)
            if x.shape[1] == self.where.shape[1]
            else (columns(self.where, at), columns(self.blank, at))
        )
        x = torch.where(where[..., None] if x.dim() == 3 else where, blank.to(x.dtype), x)
        if t is not None:
            levels = t if t.dim() == 2 else t[:, None].expand(where.shape)
            t = torch.where(where, torch.ones_like(levels), levels)
        return x, t, kw

    def __call__(self, x: Tensor, t: Tensor | None = None, self_cond: Tensor | None = None, **kw):
        if self.label is not None:
            kw = kw | {"label": self.label}
        if self.scale == 1.0:
            return self.denoiser(x, t, self_cond, **kw)
        ux, ut, ukw = self.unconditional(x, t, kw)
        if self.scale == 0.0:
            return self.denoiser(ux, ut, self_cond, **ukw)
        if t is not None and ut is not None and t.shape != ut.shape:
            t = t[:, None].expand(ut.shape)  # per-token levels for both halves of the batch

        def twice(a: Tensor | None, b: Tensor | None) -> Tensor | None:
            return None if a is None else torch.cat([a, b])

        both = kw | ({"label": twice(kw["label"], ukw["label"])} if "label" in kw else {})
        pred = self.denoiser(twice(x, ux), twice(t, ut), twice(self_cond, self_cond), **both)
        cond, uncond = pred.logits.chunk(2)
        logits = _mix(cond, uncond, self.scale)
        logits = logits.masked_fill(~torch.isfinite(cond), -torch.inf).log_softmax(-1)
        x0 = None
        if pred.x0 is not None:
            x0_cond, x0_uncond = pred.x0.chunk(2)
            x0 = x0_uncond + self.scale * (x0_cond - x0_uncond)
        return Prediction(logits=logits, x0=x0)


GUIDE_ON = ("auto", "label", "prompt", "both")


@dataclass
class Guidance:
    """What to guide on at sampling: a label index for every sample, or one per sample (a list
    as long as the samples drawn), or None; the scale; and ``on``: ``label``, ``prompt`` (the
    fixed regions of the canvas), ``both``, or ``auto`` (the label when one is given, else the
    prompt when there is one)."""

    label: int | list[int] | None = None
    scale: float = 1.0
    on: str = "auto"

    def targets(self, prompted: bool) -> tuple[bool, bool]:
        """(guide on the label, guide on the prompt); a ValueError for a missing condition."""
        if self.on not in GUIDE_ON:
            raise ValueError(f"unknown guidance.on {self.on!r}; valid: {', '.join(GUIDE_ON)}")
        if self.on == "auto":
            return self.label is not None, self.label is None and prompted
        use_label, use_prompt = self.on in ("label", "both"), self.on in ("prompt", "both")
        if use_label and self.label is None:
            raise ValueError(f"guidance.on={self.on} needs label=NAME (a class-conditional model)")
        if use_prompt and not prompted:
            raise ValueError(
                f"guidance.on={self.on} needs fixed text to guide on: prompt=, infill= or edit="
            )
        return use_label, use_prompt

    def guided_on(self, prompted: bool, scales: list[float]) -> str | None:
        """What a sample drawn under these settings (at each of ``scales``) was guided on, as its
        record says: ``label``, ``prompt``, ``both``, or None when unguided. ``auto`` counts the
        prompt only when some scale differs from 1: at w = 1 fixed text is just conditioning."""
        use_label, use_prompt = self.targets(prompted)
        use_prompt = use_prompt and (self.on != "auto" or any(w != 1.0 for w in scales))
        if not (use_label or use_prompt):
            return None
        return "both" if use_label and use_prompt else "label" if use_label else "prompt"

    def guides_prompt(self, prompted: bool) -> bool:
        """Whether a call guides on the prompt, its unconditional pass seeing the prompt at the
        prior: the prompt is a target and w != 1 (w = 1 is the conditional model itself,
        whatever the process)."""
        return self.targets(prompted)[1] and self.scale != 1.0

    def passes(self, prompted: bool) -> int:
        """Network passes per denoiser call: 2 when two conditions are mixed."""
        return mixing_passes(self.scale) if any(self.targets(prompted)) else 1

    def wrap(
        self,
        denoiser: Denoiser,
        batch: int,
        device: torch.device,
        first: int = 0,
        where: Tensor | None = None,
        blank: Tensor | None = None,
    ):
        """The guided denoiser for samples ``first`` to ``first + batch``; ``where`` / ``blank``:
        the prompt positions (B, L) and the prior's state there, for prompt guidance."""
        prompted = where is not None and bool(where.any())
        use_label, use_prompt = self.targets(prompted)[0], self.guides_prompt(prompted)
        label = None
        if isinstance(self.label, int):
            label = torch.full((batch,), self.label, dtype=torch.long, device=device)
        elif self.label is not None:
            label = torch.tensor(self.label[first : first + batch], device=device)
        if label is not None and not use_label:
            denoiser = WithLabel(denoiser, label)  # guided on the prompt alone: both passes
            label = None  # keep the label
        if not (use_label or use_prompt):
            return denoiser
        if not use_prompt:
            where = blank = None
        elif blank is None:
            raise ValueError("prompt guidance needs the prior's state at the prompt (blank=)")
        return Guided(denoiser, label, self.scale, where, blank)
