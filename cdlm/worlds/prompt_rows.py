"""Conditioning rows in world training data (``data.prompt_rate``, issue 50).

World samples are unconditional, so a model trained on them alone never sees a fixed position
beside noisy ones: a gaussian model never learns to read a clean (level-0) prompt, and no model
meets the fixed right-hand context of an infill. A share of the training rows therefore marks
some positions as ``prompt`` (B, L) bool, the batch key the losses already honour
(``cdlm.processes.prompts``: held clean, shown as sampling shows fixed text, never scored), in
one of two shapes, chosen per row:

- ``prefix``: positions 0..k-1 with k uniform in 1..L-1 (prompt→continuation);
- ``infill``: everything but one span a..b-1, 1 <= a < b <= L-1 uniform, both sides fixed
  (infilling, and a bridge between two fixed ends).

The marks are a pure function of a key, as the tokens are (``cdlm.worlds.data``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SHAPES = ("prefix", "infill")


@dataclass(frozen=True)
class PromptRows:
    """rate: the share of rows that carry a prompt; shapes: the shapes drawn among (each
    equally likely)."""

    rate: float = 0.0
    shapes: tuple[str, ...] = SHAPES

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, int | float) and 0.0 <= self.rate <= 1.0):
            raise ValueError(f"data.prompt_rate must be in [0, 1], got {self.rate!r}")
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown or not self.shapes:
            raise ValueError(
                f"data.prompt_shapes must name some of {', '.join(SHAPES)}, got {list(self.shapes)}"
            )

    @property
    def on(self) -> bool:
        return self.rate > 0

    def mark(self, n: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """(n, length) bool: the prompt positions of n rows, none in a row without a prompt."""
        if length < 3 and "infill" in self.shapes:
            raise ValueError(f"an infill prompt needs seq_len >= 3, got {length}")
        u = torch.rand(n, 3, generator=generator, dtype=torch.float64)
        prompted = u[:, 0] < self.rate
        shape = (u[:, 1] * len(self.shapes)).long().clamp_max(len(self.shapes) - 1)
        pos = torch.arange(length)
        # prefix k in 1..L-1; span start a in 1..L-2 and end b in a+1..L-1
        k = 1 + (u[:, 2] * (length - 1)).long().clamp_max(length - 2)
        a = 1 + (u[:, 2] * (length - 2)).long().clamp_max(length - 3)
        b = a + 1 + (torch.rand(n, generator=generator, dtype=torch.float64) * (length - 1 - a))
        b = b.long().clamp_max(length - 1)
        prefix = pos[None, :] < k[:, None]
        infill = (pos[None, :] < a[:, None]) | (pos[None, :] >= b[:, None])
        is_infill = torch.tensor([s == "infill" for s in self.shapes])[shape]
        marks = torch.where(is_infill[:, None], infill, prefix)
        return marks & prompted[:, None]
