"""Learned token embeddings for embedding diffusion, and their nearest-embedding readout; the
class-label embedding every conditional network shares."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class NormalizedEmbedding(nn.Module):
    """Learned token embeddings with every row rescaled to norm ``scale * sqrt(dim)``: the signal
    has a fixed size against unit-variance noise, so it cannot grow to escape the noise."""

    def __init__(self, vocab_size: int, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, dim))
        self.dim, self.scale = dim, scale

    def table(self) -> Tensor:
        """(V, D) normalised embedding table."""
        return F.normalize(self.weight, dim=-1) * (self.scale * math.sqrt(self.dim))

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, L) token ids -> (B, L, D) embeddings."""
        return self.table()[tokens]

    def logits(self, x: Tensor) -> Tensor:
        """Nearest-embedding readout, (B, L, D) -> (B, L, V): -||x - e_v||^2 / 2 up to a constant
        per position (rows share one norm), so its argmax is the nearest embedding. Always fp32:
        under bf16 autocast the inner products (up to dim) would be rounded by ~0.1, and the
        readout skip multiplies them by alpha / sigma^2."""
        with torch.autocast(x.device.type, enabled=False):
            return x.float() @ self.table().float().T

    def nearest(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, L) ids of the nearest embeddings."""
        return self.logits(x).argmax(-1)


class LabelEmbedding(nn.Embedding):
    """One vector per class plus one for "no label" (label -1 or None), zero at start so that
    training begins from the unconditional network (classifier-free guidance trains both)."""

    def __init__(self, num_classes: int, dim: int) -> None:
        super().__init__(num_classes + 1, dim)
        nn.init.zeros_(self.weight)
        self.num_classes = num_classes

    def of(self, label: Tensor | None, batch: int, device: torch.device) -> Tensor:
        """(B, dim): each row's label vector; None means no label for every row."""
        if label is None:
            label = torch.full((batch,), -1, dtype=torch.long, device=device)
        return self(torch.where(label < 0, self.num_classes, label))


def refuse_labels(label: Tensor | None) -> None:
    """An unconditional network's check: a real label (>= 0) is an error, not ignored."""
    if label is not None and bool((label >= 0).any()):
        raise ValueError("this network was trained without labels (num_classes=0)")
