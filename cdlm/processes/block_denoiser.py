"""The block process's denoiser (``cdlm.processes.block``): one window call denoises a block
against the KV cache of the clean past and, in the same call, writes the clean positions the
cache still lacks (the block finished before it, or a whole prompt), so a block at one step
costs one call (``cdlm.samplers.blockwise``); with the shifted layout the window also holds the
block's tail, its own last token, seen by the whole block."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cdlm.denoiser import Prediction
from cdlm.networks.two_tower import stream_flags
from cdlm.processes.block_masks import chunk_mask, clean_visibility, vectorised_mask
from cdlm.processes.masked import MaskedDenoiser
from cdlm.processes.support import TokenSupport


@dataclass
class Chunk:
    """The raw network outputs of a window call: ``clean`` (B, C, V) at the clean positions it
    wrote (``clean_positions``; with a causal clean stream, next-token logits) and ``window``
    (B, W, V) at the block's positions."""

    clean: Tensor
    window: Tensor
    clean_positions: Tensor


class BlockDenoiser(MaskedDenoiser):
    """SUBS log-probabilities of a block-causal network.

    A whole-canvas call predicts every block from the clean stream ``clean`` (default: the
    canvas itself, i.e. each block given the canvas's blocks before it). A window call
    (``positions``: one block [a, b)) predicts that block given the canvas's first a tokens as
    the clean past: with ``cache`` (a KV cache holding the clean past's first ``cache.length``
    positions) it writes the clean positions from there up to a and denoises the block in one
    call; with no cache it recomputes the clean past in the same call. ``sees_last``: a
    shifted block's window has its tail (module docstring) at block sizes above 1."""

    def __init__(
        self,
        network: nn.Module,
        mask_id: int,
        block_size: int,
        shift_from: int | None = None,
        causal_clean: bool = False,
        sees_last: bool = True,
        support: TokenSupport | None = None,
    ) -> None:
        super().__init__(network, mask_id, shift_from, support)
        self.block_size, self.causal_clean = block_size, causal_clean
        self.tail = sees_last and shift_from is not None and block_size > 1

    def window_positions(self, positions: Tensor) -> Tensor:
        """The network positions a window call for the canvas ``positions`` (a block, or its
        end) runs: those, and with a tail one more, whose input is their last token."""
        if not self.tail:
            return positions
        return torch.cat([positions, positions[-1:] + 1])

    def __call__(
        self,
        z: Tensor,
        t: Tensor,
        self_cond: Tensor | None = None,
        subs: bool = True,
        *,
        positions: Tensor | None = None,
        clean: Tensor | None = None,
        cache=None,
        **kwargs,
    ) -> Prediction:
        if positions is None:
            out, _ = self.streams(z, z if clean is None else clean, **kwargs)
            return self.parameterize(out, z, subs)
        chunk = self.chunk(z, positions, cache, **kwargs)
        return self.parameterize(chunk.window, z[:, positions], subs)

    def streams(self, z: Tensor, clean: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
        """Raw outputs (B, L, V) of the noisy and the clean stream under the vectorised mask.
        Shifted, a noisy block's first input is the clean token before it; with tails, each
        block's tail (its last token, at the position after it) runs between the streams."""
        length, device = z.shape[1], z.device
        pos = torch.arange(length, device=device)
        noisy_in = self.window_inputs(z, pos)
        if self.shift_from is not None:
            starts = (pos % self.block_size == 0) & (pos > 0)
            noisy_in = torch.where(starts[None], self.window_inputs(clean, pos), noisy_in)
        ends = torch.arange(self.block_size, length + self.block_size, self.block_size)
        tails = ends.clamp(max=length).to(device) if self.tail else pos[:0]
        at = torch.cat([pos, tails, pos])
        inputs = torch.cat(
            [noisy_in, self.window_inputs(z, tails), self.window_inputs(clean, pos)], 1
        )
        mask = vectorised_mask(length, self.block_size, self.causal_clean, self.tail, device)
        zeros = torch.zeros(z.shape[0], device=device)
        noisy = length + len(tails)
        kwargs |= stream_flags(self.network, length, noisy, clean_first=False, device=device)
        out = self.network(inputs, zeros, positions=at, attn_mask=mask, **kwargs)
        return out[:, :length], out[:, noisy:]

    def chunk(
        self, z: Tensor, positions: Tensor, cache=None, start: int | None = None, **kwargs
    ) -> Chunk:
        """One window call on canvas ``z`` for the block at ``positions`` (contiguous, from
        ``start``, by default its first; empty: a call that only writes): the clean positions
        not yet in ``cache`` up to ``start`` (all of 0..start-1 without one) are computed from z
        in the same call and, with a cache, kept in it; the window's entries (its tail among
        them, whose output is dropped) are not kept."""
        start = int(positions[0]) if start is None else start
        device = z.device
        past = 0 if cache is None else cache.length
        if past > start:
            raise ValueError(f"the cache holds {past} positions, past the block's start {start}")
        clean, window = torch.arange(past, start, device=device), self.window_positions(positions)
        inputs = torch.cat([self.window_inputs(z, clean), self.window_inputs(z, window)], 1)
        mask = chunk_mask(past, clean, len(window), self.block_size, self.causal_clean)
        zeros = torch.zeros(z.shape[0], device=device)
        at = torch.cat([clean, window])
        kwargs |= stream_flags(self.network, len(clean), len(window), True, device)
        out = self.network(inputs, zeros, positions=at, attn_mask=mask, cache=cache, **kwargs)
        if cache is not None and not cache.frozen:
            cache.truncate(start)  # the clean past is kept; the window changes every step
        c = len(clean)
        return Chunk(out[:, :c], out[:, c : c + len(positions)], clean)

    def next_token_logits(self, tokens: Tensor, **kwargs) -> Tensor:
        """The clean stream alone under causal attention: next-token logits (B, L, V), row i
        predicting tokens[:, i] (shifted layout only)."""
        length, device = tokens.shape[1], tokens.device
        pos = torch.arange(length, device=device)
        mask = clean_visibility(pos, pos, self.block_size, causal=True)
        zeros = torch.zeros(tokens.shape[0], device=device)
        inputs = self.window_inputs(tokens, pos)
        return self.network(inputs, zeros, positions=pos, attn_mask=mask, **kwargs)
