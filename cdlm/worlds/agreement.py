"""The agreement world: a name declared once must recur identically later, filler between.

Text comes in segments of ``period`` tokens. Each segment opens with one of ``names`` name
tokens drawn uniformly (a variable declared as, say, sensor_id or device_id), continues with
filler from the character chain (started from its stationary distribution), and closes with
the same name again (the variable used). Alone, each end of a segment is uniform over the names;
jointly they agree always. A sampler that decides both ends in one step from their marginals
disagrees with probability 1 - 1/names: factorised decoding provably fails here (Zhang et al.
2026 make the same point with block parity). The world's total correlation, sum_i H(x_i) -
H(x), is exact (``World.total_correlation``); each whole segment contributes log(names) to it
beyond the filler's own.
"""

from __future__ import annotations

import math
import string

import torch
from torch import Tensor

from cdlm.worlds.base import World
from cdlm.worlds.chain import ALPHABET, CharChain, symbol_tokenizer
from cdlm.worlds.transition import Transition


class Agreement(World):
    """Declare-and-use segments over the character chain.

    Args:
        names: how many name tokens (uppercase letters A, B, ...); 2 by default (50/50).
        period: tokens per segment, >= 2 (name, period - 2 filler characters, name).
        length: sequence length (several segments; a last partial one has no closing name).
        path, smoothing: the filler chain's corpus and smoothing (``CharChain``).
    """

    def __init__(
        self,
        names: int = 2,
        period: int = 16,
        length: int = 128,
        path: str | None = None,
        smoothing: float = 1e-4,
    ) -> None:
        if not 1 <= names <= 26 or period < 2:
            raise ValueError(f"need 1 <= names <= 26 and period >= 2, got {names}, {period}")
        chars = CharChain(path, length, smoothing)
        c, k = len(ALPHABET), names
        filler, start = chars.steps[0].dense, chars.initial
        size = k + c * k  # names 0..k-1, then (character, remembered name) pairs

        def char_state(ch: Tensor | int, name: Tensor | int) -> Tensor | int:
            return k + name * c + ch

        memory = torch.cat([torch.arange(k), torch.arange(k).repeat_interleave(c)])
        declare = torch.full((size, size), 0.0, dtype=torch.float64)
        declare[:, :k] = 1.0 / k
        use = torch.zeros(size, size, dtype=torch.float64)
        use[torch.arange(size), memory] = 1.0
        first = torch.zeros(size, size, dtype=torch.float64)
        chain = torch.zeros(size, size, dtype=torch.float64)
        for name in range(k):
            block = slice(char_state(0, name), char_state(c, name))
            first[memory == name, block] = start
            chain[block, block] = filler
            chain[name, block] = start  # a name state never precedes filler here; kept stochastic
        steps = [declare, first] + [chain] * (period - 3) + [use]
        if period == 2:
            steps = [declare, use]
        offset = 3
        emit = torch.cat([offset + c + torch.arange(k), offset + torch.arange(c).repeat(k)])
        tokenizer = symbol_tokenizer(list(ALPHABET) + list(string.ascii_uppercase[:k]))
        initial = torch.zeros(size, dtype=torch.float64)
        initial[:k] = 1.0 / k
        super().__init__(
            "agreement", tokenizer, emit, initial, [Transition(s) for s in steps], length
        )
        self.names, self.period = names, period

    def segments(self, length: int | None = None) -> int:
        """Whole segments (a declaration and its use) in a sequence of ``length``."""
        return (self.length if length is None else length) // self.period

    def describe(self) -> dict:
        return super().describe() | {
            "names": self.names,
            "period": self.period,
            "total_correlation_bits": self.total_correlation() / math.log(2),
            "pair_information_bits": self.segments() * math.log2(self.names),
        }

    def disagreements(self, tokens: Tensor) -> Tensor:
        """(B,) the share of whole segments whose closing name differs from the opening one."""
        n = self.segments(tokens.shape[1])
        if n == 0:
            return torch.zeros(tokens.shape[0])
        starts = torch.arange(n) * self.period
        return (tokens[:, starts] != tokens[:, starts + self.period - 1]).double().mean(-1)

    def constraint_rate(self, tokens: Tensor) -> Tensor:
        """(B,) the share of whole segments whose names disagree (``disagreements``)."""
        return self.disagreements(tokens)
