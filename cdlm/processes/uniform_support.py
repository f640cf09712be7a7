"""The tokens uniform-state noise draws from (issue 51): the data's, not the whole vocabulary.

Noise that redraws from every id of the tokenizer puts ``<pad>`` and ``<mask>`` (and in a world,
which packs no ``<eos>``, that too) into x_t although no clean sequence holds them. A model then
has to learn to give them no x0 mass, and a little left over is enough to keep one: the last step
multiplies a token's x0_hat by its own evidence alpha V / (1 - alpha) + 1 (about 3,800 at
t = 1/128 for V = 30), so a model with 1e-3 of x0_hat there ended 4.2% of its world samples
holding one (docs/results/duo_last_step.md). Noise over the K tokens the data can hold is the
uniform-state process on those K states: the prior, every kernel and the ELBO read K, and x0_hat
gives the excluded ids no mass (as SUBS gives [MASK] none), so no step can draw one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cdlm import rng
from cdlm.schedules import MaskSchedule


def excluded_ids(tokenizer, held: Sequence[int]) -> list[int]:
    """The special ids of ``tokenizer`` that the data never holds (``held``: the specials its
    rows do hold at scored positions, e.g. the EOS that text packing writes)."""
    return sorted(set(tokenizer.all_special_ids) - set(held))


class NoiseSupport(nn.Module):
    """The K ids of a vocabulary of ``vocab_size`` that uniform noise draws from: all but
    ``excluded``. Its tensors follow the process's device and are not saved (the config
    rebuilds them).

    Args:
        vocab_size: the tokenizer's size V (the network's input and output width).
        excluded: ids the data never holds; empty: the whole vocabulary (Duo's reference, and
            every model file written before the support existed).
    """

    def __init__(self, vocab_size: int, excluded: Sequence[int] = ()) -> None:
        super().__init__()
        out = sorted({int(i) for i in excluded})
        bad = [i for i in out if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(
                f"process.excluded ids {bad} are outside the vocabulary of {vocab_size}"
            )
        inside = torch.ones(vocab_size, dtype=torch.bool)
        inside[out] = False
        self.size, self.whole = int(inside.sum()), not out
        if self.size < 2:
            raise ValueError(f"process.excluded leaves {self.size} token(s) to draw noise from")
        ids = inside.nonzero().squeeze(-1)
        index = torch.zeros(vocab_size, dtype=torch.long).index_copy_(
            0, ids, torch.arange(len(ids))
        )
        self.register_buffer("inside", inside, persistent=False)  # (V,) bool
        self.register_buffer("ids", ids, persistent=False)  # (K,) the support's ids, ascending
        self.register_buffer("index", index, persistent=False)  # (V,) id -> place in ids
        self.register_buffer("out", torch.tensor(out, dtype=torch.long), persistent=False)

    @property
    def mask(self) -> Tensor | None:
        """(V,) bool, True on the support; None for the whole vocabulary."""
        return None if self.whole else self.inside

    def draw(self, shape, generator: rng.Draws, device: torch.device) -> Tensor:
        """Ids drawn uniformly from the support, ``shape``; with nothing excluded the very
        draws of ``randint(V)``, so a whole-vocabulary model samples as it always did."""
        k = rng.randint(self.size, shape, generator, device=device)
        return k if self.whole else self.ids.to(device)[k]

    def restrict(self, logits: Tensor) -> Tensor:
        """(..., V) ``logits`` with -inf on the excluded ids: an x0_hat with no mass there."""
        return logits if self.whole else logits.index_fill(-1, self.out, -math.inf)

    def check(self, tokens: Tensor, valid: Tensor) -> None:
        """Refuses training tokens (B, L) outside the support at ``valid`` positions: the
        process has no state for them, so the bound would not be one."""
        if self.whole:
            return
        outside = ~self.inside[tokens] & valid
        if bool(outside.any()):
            token = int(tokens[outside][0])
            raise ValueError(
                f"token id {token} is in the data but outside process=uniform's noise support "
                f"(process.excluded={self.out.tolist()}); set process.excluded=[] to draw noise "
                "from the whole vocabulary"
            )


@dataclass(frozen=True)
class UniformNoise:
    """What an exact denoiser of uniform noise reads each x_t by (``cdlm.worlds.uniform``):
    alpha(t) and the support the noise draws from."""

    schedule: MaskSchedule
    support: NoiseSupport
