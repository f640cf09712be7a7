"""The ids a token process's x0_hat may predict: all but the specials the data never holds
(issue 51).

A softmax over every id of the tokenizer leaves a little mass on ``<pad>``, ``<mask>`` and, in a
world (which packs none), ``<eos>``, although no clean sequence holds them; a sampler then draws
one now and then, and a world scores that sample impossible (an infinite KL rate:
docs/results/duo_last_step.md). Setting those logits to -inf at build time, as SUBS does for
[MASK], makes the draw impossible by construction. The set is filled in from the tokenizer and
the data (``excluded_ids``), recorded in the model file, and empty in files written before it
(the whole vocabulary, as they were trained).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn


def excluded_ids(tokenizer, held: Sequence[int]) -> list[int]:
    """The special ids of ``tokenizer`` that the data never holds (``held``: the specials its
    rows do hold at scored positions, e.g. the EOS that text packing writes)."""
    return sorted(set(tokenizer.all_special_ids) - set(held))


class TokenSupport(nn.Module):
    """The ids of a vocabulary of ``vocab_size`` that x0_hat may put mass on: all but
    ``excluded``. Its tensors follow the process's device and are not saved (the config
    rebuilds them).

    Args:
        vocab_size: the tokenizer's size V (the network's output width).
        excluded: ids the data never holds; empty: the whole vocabulary.
        process: the owner's name, for the error that refuses data outside the support.
    """

    def __init__(self, vocab_size: int, excluded: Sequence[int] = (), process: str = "") -> None:
        super().__init__()
        out = sorted({int(i) for i in excluded})
        bad = [i for i in out if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(
                f"process.excluded ids {bad} are outside the vocabulary of {vocab_size}"
            )
        inside = torch.ones(vocab_size, dtype=torch.bool)
        inside[out] = False
        self.size, self.whole, self.process = int(inside.sum()), not out, process
        if self.size < 2:
            raise ValueError(f"process.excluded leaves {self.size} token(s) to predict")
        self.register_buffer("inside", inside, persistent=False)  # (V,) bool
        self.register_buffer("out", torch.tensor(out, dtype=torch.long), persistent=False)

    @property
    def mask(self) -> Tensor | None:
        """(V,) bool, True on the support; None for the whole vocabulary."""
        return None if self.whole else self.inside

    def restrict(self, logits: Tensor) -> Tensor:
        """(..., V) ``logits`` with -inf on the excluded ids: an x0_hat with no mass there."""
        return logits if self.whole else logits.index_fill(-1, self.out, -math.inf)

    def check(self, tokens: Tensor, valid: Tensor) -> None:
        """Refuses training tokens (B, L) outside the support at ``valid`` positions: x0_hat
        gives them no mass, so the bound would be infinite rather than one."""
        if self.whole:
            return
        outside = ~self.inside[tokens] & valid
        if bool(outside.any()):
            token = int(tokens[outside][0])
            raise ValueError(
                f"token id {token} is in the data but outside process={self.process}'s support "
                f"(excluded ids {self.out.tolist()}); set process.excluded=[] to keep every "
                "ordinary id"
            )
