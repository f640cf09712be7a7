"""Training FLOPs (cdlm/training/flops.py): the counter against a hand count of a tiny network's
forward and backward, attention included on the CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cdlm.training.flops import flop_counter

B, L, D_IN, D, HEADS, D_OUT = 2, 5, 8, 16, 2, 4


class Tiny(nn.Module):
    """Linear, self-attention over its output (HEADS heads), linear."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(D_IN, D, bias=False)
        self.out = nn.Linear(D, D_OUT, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x).view(B, L, HEADS, D // HEADS).transpose(1, 2)
        a = F.scaled_dot_product_attention(h, h, h).transpose(1, 2).reshape(B, L, D)
        return self.out(a)


def test_a_step_counts_every_matmul_and_the_attention_forward_and_backward():
    tokens, dh = B * L, D // HEADS
    forward = 2 * tokens * D_IN * D + 4 * B * HEADS * L * L * dh + 2 * tokens * D * D_OUT
    # backward: out's input and weight gradients; attention's five products (the scores
    # recomputed, as a fused kernel does, and four gradients); inp's weight gradient only (its
    # input needs none)
    backward = 2 * (2 * tokens * D * D_OUT) + 10 * B * HEADS * L * L * dh + 2 * tokens * D_IN * D
    net = Tiny()
    with flop_counter() as counter:
        net(torch.randn(B, L, D_IN)).sum().backward()
    assert counter.get_total_flops() == forward + backward == 20160
