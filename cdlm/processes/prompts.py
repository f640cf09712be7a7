"""The prompt of prompt→response training rows (``data.format=pairs``), as a loss reads it.

A batch of pairs carries ``prompt`` (B, L) bool: the positions the model conditions on and is
never scored on (``losses.valid_mask`` leaves them out). Prompt dropout (``condition.
prompt_dropout``) marks whole rows in ``prompt_dropped`` (B,): their prompt is shown at the
prior, as the unconditional pass of prompt guidance shows it at sampling (``cdlm.guidance.
Guided``), so that one model learns both branches that guidance mixes. A batch without
``prompt`` has no prompt, and every loss is then exactly the unconditional one.

The gaussian process shows a held prompt (in training and in sampling alike) in one of
``PROMPT_VIEWS``: ``noised``, the truth noised to the row's own level (replacement inpainting),
or ``clean``, at level 0 through the per-token levels the network reads (its level-0 mean
alpha(0) x0, no noise draw), so that the prompt stays legible at every level (issue 50).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from cdlm import rng
from cdlm.denoiser import Denoiser, HoldFixed, Prediction, Wrapper, columns, per_position
from cdlm.processes.base import Corrupted

PROMPT_VIEWS = ("noised", "clean")


def check_view(view: str) -> str:
    """``view`` if it is one of ``PROMPT_VIEWS``, else an error that lists them."""
    if view not in PROMPT_VIEWS:
        raise ValueError(f"unknown prompt_view {view!r}; valid: {', '.join(PROMPT_VIEWS)}")
    return view


def clean_view(x0: Tensor, levels: Tensor, fixed: Tensor, schedule) -> tuple[Tensor, Tensor]:
    """The ``clean`` view of the ``fixed`` positions (B, L): their level-0 embedding
    alpha(0) x0 (B, L, D) and per-token levels (B, L) that are 0 there and ``levels`` ((B,) or
    (B, L)) elsewhere; the embedding is returned for every position, the caller picks."""
    per_token = levels if levels.dim() == 2 else levels[:, None].expand(fixed.shape)
    zero = torch.zeros_like(per_token)
    return per_position(schedule.alpha(zero)) * x0, torch.where(fixed, zero, per_token)


class ShowClean(Wrapper):
    """Shows the ``fixed`` positions (B, L) of ``x0`` (B, L, D) in the ``clean`` view before
    each call (sampling); gaussian ``hold_fixed`` wraps it in ``HoldFixed``, which writes the
    truth into the prediction there. A windowed call (``positions``) covers its columns only."""

    def __init__(self, denoiser: Denoiser, schedule, fixed: Tensor, x0: Tensor) -> None:
        self.denoiser, self.schedule, self.fixed, self.x0 = denoiser, schedule, fixed, x0

    def __call__(self, x_t: Tensor, t: Tensor, self_cond=None, **kwargs) -> Prediction:
        at = kwargs.get("positions")
        fixed = columns(self.fixed, at)
        clean, levels = clean_view(columns(self.x0, at), t, fixed, self.schedule)
        x = torch.where(fixed[..., None], clean.to(x_t.dtype), x_t)
        return self.denoiser(x, levels, self_cond, **kwargs)


def hold_view(
    denoiser: Denoiser, schedule, ids: Tensor, fixed: Tensor, x0: Tensor, view: str, generator
) -> Denoiser:
    """A gaussian denoiser that holds the ``fixed`` positions of ``ids`` (B, L) at their ground
    truth ``x0``: the network sees them noised to the current level at every step (one noise
    draw for the run, so an ODE trajectory stays deterministic), or at level 0 (``view`` clean:
    ``ShowClean``), and their x0 estimate and logits are the truth (``HoldFixed``)."""
    noise = rng.randn(x0.shape, generator, device=x0.device, dtype=x0.dtype)
    if view == "clean":
        denoiser = ShowClean(denoiser, schedule, fixed, x0)
    return HoldFixed(denoiser, schedule, ids, fixed, x0, noise)


@dataclass
class Prompt:
    """held: (B, L) prompt positions shown as sampling holds a prompt; blank: (B, L) prompt
    positions of dropped rows, shown at the prior."""

    held: Tensor
    blank: Tensor

    def repeat(self, k: int) -> Prompt:
        """The prompt of a batch stacked ``k`` times on itself (complementary masking)."""
        return Prompt(self.held.repeat(k, 1), self.blank.repeat(k, 1))


def prompt_of(batch: dict[str, Tensor]) -> Prompt | None:
    """The batch's prompt, split by prompt dropout; None when the batch has none."""
    prompt = batch.get("prompt")
    if prompt is None:
        return None
    prompt = prompt.bool()
    dropped = batch.get("prompt_dropped")
    blank = prompt & dropped[:, None] if dropped is not None else torch.zeros_like(prompt)
    return Prompt(prompt & ~blank, blank)


def drop_prompts(
    batch: dict[str, Tensor], p: float, generator: torch.Generator | None = None
) -> dict[str, Tensor]:
    """``batch`` with each row's prompt dropped with probability ``p`` (``prompt_dropped``);
    ``batch`` itself when it has no prompt or ``p`` is 0, so unconditional training draws no
    extra random numbers."""
    if p == 0 or "prompt" not in batch:
        return batch
    tokens = batch["tokens"]
    u = torch.rand(tokens.shape[0], device=tokens.device, generator=generator)
    return batch | {"prompt_dropped": u < p}


def hold_tokens(c: Corrupted, prompt: Prompt, blank_id: int) -> Corrupted:
    """A token corruption with the prompt held clean (never corrupted) and the dropped prompts
    at the prior, every position ``blank_id`` (the [MASK] of masked diffusion)."""
    x_t = torch.where(prompt.held, c.tokens, c.x_t)
    x_t = torch.where(prompt.blank, blank_id, x_t)
    return replace(c, x_t=x_t, noisy=(c.noisy & ~prompt.held) | prompt.blank)


def hold_embeddings(
    c: Corrupted, prompt: Prompt, generator=None, *, view: str = "noised", schedule=None
) -> Corrupted:
    """An embedding corruption with the prompt shown as sampling shows it. A held prompt is what
    gaussian ``hold_fixed`` feeds: in the ``noised`` view the truth noised to the row's own
    level, which the corruption holds already; in the ``clean`` view its level-0 embedding at
    level 0 (``clean_view``, with ``schedule``; no noise there). A dropped one is at the prior:
    fresh N(0, I) noise at level 1, as prompt guidance's unconditional pass shows it
    (``Guided.unconditional``)."""
    if check_view(view) == "clean" and bool(prompt.held.any()):
        clean, levels = clean_view(c.x0, c.t, prompt.held, schedule)
        held = prompt.held[..., None]
        x_t = torch.where(held, clean.to(c.x_t.dtype), c.x_t)
        noise = torch.where(held, torch.zeros_like(c.noise), c.noise)
        c = replace(c, x_t=x_t, t=levels, noise=noise)
    if not bool(prompt.blank.any()):
        return c
    blank = prompt.blank[..., None]
    draw = torch.randn(c.x_t.shape, device=c.x_t.device, generator=generator).to(c.x_t.dtype)
    levels = c.t if c.t.dim() == 2 else c.t[:, None].expand(prompt.blank.shape)
    return replace(
        c,
        x_t=torch.where(blank, draw, c.x_t),
        t=torch.where(prompt.blank, torch.ones_like(levels), levels),
        noise=torch.where(blank, draw, c.noise),
    )
