"""The Transformer's KV cache: the seam for cached AR decoding, block diffusion and
Fast-dLLM-style cached diffusion decoding (Wu et al. 2025).

A cache holds, per layer, the keys and values of every position written so far, in the order
they were written. What a new chunk sees is fixed by the network: a causal network's chunk sees
every cached key plus the chunk's keys up to its own index; a bidirectional network's chunk sees
every cached key and every key of the chunk. Rotary angles come from each call's ``positions``
(by default the next ``cache.length`` onward), so the order of writing need not be the order of
positions. Cached keys and values keep the noise level and label of the call that wrote them.

Three uses:

- AR decoding: write each new chunk (one token, or a prefill of any length).
- Block diffusion (Arriola et al. 2025): write the clean prefix; denoise the next block over
  several steps inside ``with cache.read_only():`` (each step attends to the fixed prefix and
  writes nothing); then one ordinary call on the committed block appends it.
- Fast-dLLM dual cache: refresh by writing [prefix, suffix, block] in one call with positions
  [0..p-1, p+b..L-1, p..p+b-1] (bidirectional attention with explicit positions does not care
  about order, so this equals one plain pass over the sequence), then ``cache.truncate(p + s)``
  to drop the block's stale entries; each denoising step of the block then runs read-only with
  positions p..p+b-1. (Positions are the network's: on a shifted model, whose input is one
  longer, the block's window reaches one position further, p..p+b, because that position
  reads the block's last token; ``cdlm.samplers.blockwise.Calls.window``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from cdlm.networks.layer_cache import LayerCache, PreallocatedLayerCache


class KVCache:
    """One ``LayerCache`` per Transformer block, list-like (``len(cache)`` layers, ``cache[i]``),
    from ``Transformer.new_cache()``; ``forward(..., cache=cache)`` reads and extends it.
    ``capacity``: preallocate each layer for that many positions (``PreallocatedLayerCache``,
    growing if ever needed); None concatenates.

    While ``frozen`` is True (set it, or use ``read_only()``), forward passes attend to the
    cache without writing into it, so a block can be denoised over several steps against a fixed
    prefix.
    """

    def __init__(self, n_layers: int, capacity: int | None = None) -> None:
        self.layers = [
            LayerCache() if capacity is None else PreallocatedLayerCache(capacity)
            for _ in range(n_layers)
        ]
        self.frozen = False
        self.real: Tensor | None = None  # (B, T): which cached keys are not padding

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerCache:
        return self.layers[i]

    def __iter__(self) -> Iterator[LayerCache]:
        return iter(self.layers)

    @property
    def length(self) -> int:
        """Number of cached positions (the same in every layer)."""
        return self.layers[0].length if self.layers else 0

    def truncate(self, length: int) -> None:
        """Drop every position after the first ``length``, e.g. to replace a block or to roll
        back a rejected draft."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        for layer in self.layers:
            layer.truncate(length)
        if self.real is not None:
            self.real = self.real[:, :length]

    def keys_real(self, chunk: Tensor) -> Tensor:
        """(B, T + L): which of the cached keys and a chunk's (``chunk``, (B, L)) are real,
        not padding; kept for later calls unless ``frozen``."""
        past = self.real
        if past is None:
            past = chunk.new_ones(chunk.shape[0], self.length)
        keys = torch.cat([past, chunk], 1)
        if not self.frozen:
            self.real = keys
        return keys

    @contextmanager
    def read_only(self) -> Iterator[KVCache]:
        """Forward passes inside attend to the cache but leave it unchanged."""
        before, self.frozen = self.frozen, True
        try:
            yield self
        finally:
            self.frozen = before

    def chunk_mask(self, length: int, causal: bool, device: torch.device) -> Tensor | None:
        """Which keys a new chunk of ``length`` queries may see, (length, self.length + length)
        bool, True = visible; None when it sees every key. A causal chunk's query i sits at
        index T + i and sees keys up to it (``is_causal`` alone would align the triangle to the
        top left, wrong once T > 0)."""
        if not causal or length == 1:
            return None
        past = self.length
        return torch.ones(length, past + length, dtype=torch.bool, device=device).tril(past)


class AttentionPattern:
    """Which keys a token network's chunk attends to, for any network with ``causal``,
    ``future_visibility`` (the share of future keys visible in training: below 1 while an AR
    initialisation is annealed to full attention) and ``training``: cdlm's Transformer and a
    wrapped Hugging Face causal LM alike."""

    causal: bool
    future_visibility: float
    training: bool

    def _annealed_mask(self, length: int, device: torch.device) -> Tensor | None:
        """Causal plus a random ``future_visibility`` share of future keys (DiffuLLaMA's
        attention-mask annealing, Gong et al. 2025), in training only; None means full."""
        if self.causal or not self.training or self.future_visibility >= 1.0:
            return None
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        return causal | (torch.rand(length, length, device=device) < self.future_visibility)

    def _attention(
        self,
        length: int,
        cache: KVCache | None,
        device: torch.device,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor | None, bool]:
        """The (mask, is_causal) pair for a chunk of ``length`` queries; see ``KVCache``. A
        caller's ``attn_mask`` ((L, T + L) bool, T cached positions) replaces the pattern."""
        mask, is_causal = self._pattern(length, cache, device)
        if attn_mask is None:
            return mask, is_causal
        past = 0 if cache is None else cache.length
        if tuple(attn_mask.shape) != (length, past + length):
            raise ValueError(
                f"attn_mask must be (L, T + L) = ({length}, {past + length}) for a chunk of "
                f"{length} after {past} cached positions, got {tuple(attn_mask.shape)}"
            )
        return attn_mask, False

    def _unpadded(
        self,
        pattern: tuple[Tensor | None, bool],
        rope: Tensor | int,
        lengths: Tensor | None,
        cache: KVCache | None,
        shape: tuple[int, int],
        device: torch.device,
    ) -> tuple[Tensor | None, bool]:
        """``pattern`` with padding hidden: with ``lengths`` (B,), the keys at positions at or
        past ``lengths[b]`` (right padding of row b) are seen by no query, so a padded row
        computes what it would alone; also the keys a cache recorded as padding. Returns a
        (B, 1, L, T + L) mask, or ``pattern`` unchanged when nothing is padded."""
        if lengths is None and (cache is None or cache.real is None):
            return pattern
        batch, length = shape
        if isinstance(rope, int):
            rope = torch.arange(rope, rope + length, device=device)
        rope = rope.expand(batch, length)
        real = torch.ones_like(rope).bool() if lengths is None else rope < lengths[:, None]
        keys = real if cache is None else cache.keys_real(real)
        mask, is_causal = pattern
        if is_causal:
            past = keys.shape[1] - length
            mask = torch.ones(length, past + length, dtype=torch.bool, device=keys.device)
            mask = mask.tril(past)
        visible = keys[:, None, None, :]
        return (visible if mask is None else visible & mask), False

    def _pattern(
        self, length: int, cache: KVCache | None, device: torch.device
    ) -> tuple[Tensor | None, bool]:
        """The network's own (mask, is_causal): causal or annealed, or the cache's chunk mask."""
        if cache is None:
            return self._annealed_mask(length, device), self.causal
        if not self.causal and self.training and self.future_visibility < 1.0:
            raise ValueError(
                "the annealed attention mask (training with future_visibility < 1) has no "
                "cached form: call without a cache, or put the network in eval mode"
            )
        if cache.length == 0:  # the same kernel path as an uncached call
            return None, self.causal
        return cache.chunk_mask(length, self.causal, device), False


def check_positions(
    batch: int, length: int, past: int, positions: Tensor | None, limit: int
) -> Tensor | int:
    """Checks ``positions`` ((L,) or (B, L) ints, default past..past+L-1) against a network's
    ``limit`` (its max_seq_len); returns them, or the first one when they are the default range."""
    if positions is None:
        if past + length > limit:
            raise ValueError(
                f"a sequence of {past + length} positions is longer than this network's "
                f"max_seq_len of {limit} (set at training from data.seq_len)"
            )
        return past
    if positions.is_floating_point() or positions.shape not in ((length,), (batch, length)):
        raise ValueError(
            f"positions must be (L,) or (B, L) integers with B={batch}, L={length}, got "
            f"{tuple(positions.shape)} {positions.dtype}"
        )
    if positions.numel():
        low, high = (int(v) for v in positions.aminmax())  # one host sync per call
        if low < 0 or high >= limit:
            raise ValueError(
                f"positions must lie in [0, max_seq_len={limit}), got {low}..{high} "
                "(max_seq_len is set at training from data.seq_len)"
            )
    return positions
