"""Block diffusion's attention masks (BD3-LM, Arriola et al. 2025): which positions of the
noisy and the clean stream see which, for training on the whole sequence at once
(``vectorised_mask``) and for one chunk of cached sampling (``chunk_mask``)."""

from __future__ import annotations

import torch
from torch import Tensor


def clean_visibility(q: Tensor, k: Tensor, block_size: int, causal: bool) -> Tensor:
    """Which clean keys (positions ``k``) clean queries (positions ``q``) see: up to their own
    block, or (``causal``) up to themselves. (len(q), len(k)) bool."""
    if causal:
        return k[None, :] <= q[:, None]
    return (k[None, :] // block_size) <= (q[:, None] // block_size)


def vectorised_mask(
    length: int, block_size: int, causal_clean: bool = False, tails: bool = False, device=None
) -> Tensor:
    """(2L + T, 2L + T) bool, True = visible, over [x_t (L), tails (T), x0 (L)] (BD3-LM Sec.
    3.2): a noisy block sees itself and the clean blocks before it. ``tails``: one more noisy
    input per block (T = the number of blocks; ``BlockDenoiser.streams``), seen with its own
    block's and seeing them."""
    pos = torch.arange(length, device=device)
    clean_block = pos // block_size
    noisy_block = clean_block
    if tails:
        noisy_block = torch.cat(
            [clean_block, torch.arange(-(-length // block_size), device=device)]
        )
    q = noisy_block[:, None]
    noisy_sees = torch.cat([q == noisy_block[None, :], clean_block[None, :] < q], dim=1)
    clean = clean_visibility(pos, pos, block_size, causal_clean)
    hidden = torch.zeros(length, len(noisy_block), dtype=torch.bool, device=device)
    clean_sees = torch.cat([hidden, clean], dim=1)
    return torch.cat([noisy_sees, clean_sees], dim=0)


def chunk_mask(
    past: int, clean: Tensor, window: int, block_size: int, causal_clean: bool
) -> Tensor:
    """(C + W, past + C + W) mask of a call after ``past`` cached clean positions: the clean
    positions ``clean`` (C, written by the call) see the cache and the clean chunk by
    ``clean_visibility``, never the window; the window (W positions, one block) sees all."""
    c, device = len(clean), clean.device
    top = torch.cat(
        [
            torch.ones(c, past, dtype=torch.bool, device=device),
            clean_visibility(clean, clean, block_size, causal_clean),
            torch.zeros(c, window, dtype=torch.bool, device=device),
        ],
        dim=1,
    )
    bottom = torch.ones(window, past + c + window, dtype=torch.bool, device=device)
    return torch.cat([top, bottom], dim=0)
