"""One layer's keys and values in a KV cache (``cdlm.networks.cache``): grown by
concatenation, or written into a buffer preallocated to the network's length (gpt-fast style),
so a decoding step copies one chunk, not the whole past."""

from __future__ import annotations

import torch
from torch import Tensor


class LayerCache:
    """Keys and values of one layer, (B, H, T, Dh) each, in the order they were written."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions T."""
        return 0 if self.k is None else self.k.shape[-2]

    def extend(self, k: Tensor, v: Tensor, write: bool = True) -> tuple[Tensor, Tensor]:
        """The cached keys and values followed by a chunk's, (B, H, T + L, Dh) each, from the
        chunk's (B, H, L, Dh). Only a ``write`` keeps the chunk for later calls."""
        if self.k is None or self.v is None:
            keys, values = k, v
        else:
            keys, values = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        if write:
            self.k, self.v = keys, values
        return keys, values

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        if self.k is None or self.v is None:
            return
        if length == 0:
            self.k = self.v = None
        else:
            self.k, self.v = self.k[..., :length, :], self.v[..., :length, :]


class PreallocatedLayerCache(LayerCache):
    """A ``LayerCache`` in two buffers of ``capacity`` positions, allocated at the first write
    (gpt-fast's static cache): a chunk is copied into place, so decoding L tokens copies L
    positions, not L^2 / 2 (a read-only chunk is copied past the end and left there). ``k``,
    ``v`` and what ``extend`` returns are views, valid until the next call, bit-identical to the
    concatenating cache's. For decoding: autograd refuses a later in-place write."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.size = capacity, 0
        self.buffers: tuple[Tensor, Tensor] | None = None

    @property
    def k(self) -> Tensor | None:  # type: ignore[override]
        return None if not self.size else self.buffers[0][..., : self.size, :]

    @property
    def v(self) -> Tensor | None:  # type: ignore[override]
        return None if not self.size else self.buffers[1][..., : self.size, :]

    @property
    def length(self) -> int:
        return self.size

    def _room(self, k: Tensor, end: int) -> tuple[Tensor, Tensor]:
        """Buffers for ``end`` positions of chunks like ``k`` (grown at least twice as long)."""
        b, h, _, d = k.shape
        if self.buffers is not None:
            held = self.buffers[0]
            if (held.shape[0], held.shape[1], held.shape[3], held.dtype) != (b, h, d, k.dtype):
                if self.size:
                    raise ValueError(
                        f"a chunk of shape {tuple(k.shape)} {k.dtype} does not fit a cache of "
                        f"{tuple(held.shape)} {held.dtype}"
                    )
            elif end <= held.shape[2]:
                return self.buffers
        old = 0 if self.buffers is None else self.buffers[0].shape[2]
        size = max(self.capacity, end, 2 * old if self.size else 0)
        grown = tuple(k.new_empty(b, h, size, d) for _ in range(2))
        if self.size:
            for new, held in zip(grown, self.buffers, strict=True):
                new[..., : self.size, :] = held[..., : self.size, :]
        self.buffers = grown
        return grown

    def extend(self, k: Tensor, v: Tensor, write: bool = True) -> tuple[Tensor, Tensor]:
        end = self.size + k.shape[-2]
        keys, values = self._room(k, end)
        keys[..., self.size : end, :] = k
        values[..., self.size : end, :] = v
        if write:
            self.size = end
        return keys[..., :end, :], values[..., :end, :]

    def truncate(self, length: int) -> None:
        self.size = min(self.size, length)
