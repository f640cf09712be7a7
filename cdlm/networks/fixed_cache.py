"""A fixed-shape KV cache for the AR decode step, which a CUDA graph can capture once and replay
(gpt-fast's static cache; ``torch.cuda.CUDAGraph``).

The growing cache (``PreallocatedLayerCache``) hands attention a view of the positions written so
far, one longer every step, and the network reads the step's position as a Python number: a
graph replays fixed shapes and addresses, so it can replay neither. Here every layer attends over
its whole buffer, (B, H, capacity, Dh), with a mask of the slots written so far, and the write
position is a device tensor advanced in place, so the one-token step has the same shapes and
addresses at every call. Masked slots weigh exactly 0 after the softmax and the buffers start at
zero, so the step computes what the growing one does; its sums run over more (zero) terms, so the
logits may differ in the last bits (the same tokens: tests/test_fixed_step.py).

With ``graph`` (CUDA only) the first one-token call captures the network's step, after two
warm-up calls on a side stream whose writes are undone (they rewrite the slot the real step
writes next); every later one-token call copies its input in and replays. A prefill (a chunk of
several tokens) always runs eagerly. A network keeps one cache per batch size and mode
(``kept``), reset at each decode, so a graph is captured once per network and batch size, not
once per sample set; it reads the weights in place (an optimizer step updates them in place).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

Step = Callable[[Tensor, Tensor, Tensor | None], Tensor]  # (x, t, label) -> logits
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # network -> {key: cache}


def kept(network: nn.Module, key: tuple, make: Callable[[], FixedKVCache]) -> FixedKVCache:
    """The network's cache for ``key`` (batch, mode, device), made once, reset for a new
    decode. Kept off the module, so that copying a network (an EMA) copies no graph."""
    caches = _KEPT.setdefault(network, {})
    if key not in caches:
        caches[key] = make()
    caches[key].reset()
    return caches[key]


class FixedLayerCache:
    """One layer's keys and values, (B, H, capacity, Dh) each, allocated at zero at the first
    write (in the dtype the network computes in); a chunk is written at its slots."""

    def __init__(self, owner: FixedKVCache) -> None:
        self.owner = owner
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        return self.owner.length

    def extend(self, k: Tensor, v: Tensor, write: bool = True) -> tuple[Tensor, Tensor]:
        """Writes the chunk (B, H, L, Dh) at its slots; returns the whole buffers."""
        if not write:
            raise ValueError("a fixed-shape cache is written by every call (no read-only calls)")
        if self.k is None or self.v is None:
            shape = (*k.shape[:2], self.owner.capacity, k.shape[-1])
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
        slots = self.owner.slots(k.shape[-2])
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        return self.k, self.v


class FixedKVCache:
    """Per layer a ``FixedLayerCache`` (list-like, as ``KVCache``), for ``batch`` rows and
    ``capacity`` positions. ``position``: the next slot, on the device; ``length``: the same
    number on the host, for the callers that read it between calls (``ForcePrefix``)."""

    frozen = False
    real = None  # no padded keys: every row's slots are its own tokens

    def __init__(
        self, n_layers: int, batch: int, capacity: int, device: torch.device, graph: bool = False
    ) -> None:  # capacity: the decode's canvas, so that no call attends over unused slots
        if graph and torch.device(device).type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, got {device}")
        self.batch, self.capacity, self.graph = batch, capacity, graph
        self.layers = [FixedLayerCache(self) for _ in range(n_layers)]
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.slot_ids = torch.arange(capacity, device=device)
        self.length = 0
        self._captured: tuple[torch.cuda.CUDAGraph, dict[str, Tensor], Tensor] | None = None

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> FixedLayerCache:
        return self.layers[i]

    def __iter__(self) -> Iterator[FixedLayerCache]:
        return iter(self.layers)

    def reset(self) -> None:
        """Empty again, for a new decode: stale slots stay masked until rewritten."""
        self.position.zero_()
        self.length = 0

    def slots(self, n: int) -> Tensor:
        """(n,) the slots (and rotary positions) of the next chunk of ``n`` tokens."""
        return self.slot_ids[:n] + self.position

    def mask(self, n: int) -> Tensor:
        """(n, capacity) bool: query i of the next chunk sees the slots up to its own."""
        return self.slot_ids[None, :] <= self.slots(n)[:, None]

    def advance(self, n: int) -> None:
        """Moves the device position past a chunk of ``n`` (in place: a graph replays it)."""
        self.position.add_(n)

    def run(self, step: Step, x: Tensor, t: Tensor, label: Tensor | None) -> Tensor:
        """``step(x, t, label)`` (the network's fixed-shape step, which writes the chunk and
        calls ``advance``): eagerly, or replayed from the CUDA graph for a one-token call."""
        batch, n = x.shape[:2]
        if batch != self.batch or self.length + n > self.capacity:
            raise ValueError(
                f"a chunk of {batch} x {n} does not fit a fixed cache of {self.batch} rows with "
                f"{self.capacity - self.length} of {self.capacity} positions left"
            )
        if self.graph and n == 1:
            out = self._replay(step, x, t, label)
        else:
            out = step(x, t, label)
        self.length += n
        return out

    def _replay(self, step: Step, x: Tensor, t: Tensor, label: Tensor | None) -> Tensor:
        inputs = {"x": x, "t": t} | ({} if label is None else {"label": label})
        if self._captured is None:
            self._captured = self._capture(step, {k: v.clone() for k, v in inputs.items()})
        graph, static, out = self._captured
        if static.keys() != inputs.keys():
            raise ValueError("a captured decode step takes the same inputs at every call")
        for key, value in inputs.items():
            static[key].copy_(value)
        graph.replay()
        return out.clone()  # the next replay overwrites ``out``

    def _capture(
        self, step: Step, static: dict[str, Tensor]
    ) -> tuple[torch.cuda.CUDAGraph, dict[str, Tensor], Tensor]:
        def call() -> Tensor:
            return step(static["x"], static["t"], static.get("label"))

        start = self.position.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy library and kernel set-up, kept out of the graph
            for _ in range(2):
                call()
                self.position.copy_(start)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # recorded, not run: the position is still ``start``
            out = call()
        return graph, static, out
