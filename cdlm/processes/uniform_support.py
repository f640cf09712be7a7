"""The tokens uniform-state noise draws from (issue 51): the data's, not the whole vocabulary.

Noise that redraws from every id of the tokenizer puts ``<pad>`` and ``<mask>`` (and in a world,
which packs no ``<eos>``, that too) into x_t although no clean sequence holds them. A model then
has to learn to give them no x0 mass, and a little left over is enough to keep one: the last step
multiplies a token's x0_hat by its own evidence alpha V / (1 - alpha) + 1 (about 3,800 at
t = 1/128 for V = 30), so a model with 1e-3 of x0_hat there ended 4.2% of its world samples
holding one (docs/results/duo_last_step.md). Noise over the K tokens the data can hold is the
uniform-state process on those K states: the prior, every kernel and the ELBO read K, and x0_hat
gives the excluded ids no mass (``cdlm.processes.support``, shared with the masked process's
SUBS), so no step can draw one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cdlm import rng
from cdlm.processes.support import TokenSupport
from cdlm.schedules import MaskSchedule


class NoiseSupport(TokenSupport):
    """The K ids of a vocabulary of ``vocab_size`` that uniform noise draws from: all but
    ``excluded`` (``TokenSupport``: x0_hat has no mass outside either).

    Args:
        vocab_size: the tokenizer's size V (the network's input and output width).
        excluded: ids the data never holds; empty: the whole vocabulary (Duo's reference, and
            every model file written before the support existed).
    """

    def __init__(self, vocab_size: int, excluded: Sequence[int] = ()) -> None:
        super().__init__(vocab_size, excluded, process="uniform")
        ids = self.inside.nonzero().squeeze(-1)
        index = torch.zeros(vocab_size, dtype=torch.long).index_copy_(
            0, ids, torch.arange(len(ids))
        )
        self.register_buffer("ids", ids, persistent=False)  # (K,) the support's ids, ascending
        self.register_buffer("index", index, persistent=False)  # (V,) id -> place in ids

    def draw(self, shape, generator: rng.Draws, device: torch.device) -> Tensor:
        """Ids drawn uniformly from the support, ``shape``; with nothing excluded the very
        draws of ``randint(V)``, so a whole-vocabulary model samples as it always did."""
        k = rng.randint(self.size, shape, generator, device=device)
        return k if self.whole else self.ids.to(device)[k]


@dataclass(frozen=True)
class UniformNoise:
    """What an exact denoiser of uniform noise reads each x_t by (``cdlm.worlds.uniform``):
    alpha(t) and the support the noise draws from."""

    schedule: MaskSchedule
    support: NoiseSupport
