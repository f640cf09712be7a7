"""Random streams for sampling and evaluation, kept apart from training's.

``cdlm-train`` seeds torch's global generator (``seed_everything(seed)``), and the first draws of
that stream initialise the weights: a gaussian model's embedding table, whose rarely trained rows
stay near their initial values. A sampler or evaluation that seeded its own generator with the
same integer would replay that stream, so its noise rows would coincide with embedding rows, and
every readout would snap to those tokens (measured on a 10-minute model trained with seed 0 and
scored with seed 0: no-context accuracy 0.002 at t = 0.7 where it is 0.75). Every non-training
stream therefore takes its seed through ``mixed_seed``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: consecutive seeds land far apart
_OFFSET = 0x632BE59BD9B4E019


def mixed_seed(seed: int) -> int:
    """A 63-bit seed that no small training seed equals."""
    return (seed * _GOLDEN + _OFFSET) % 2**63


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` for sampling/evaluation seed ``seed``."""
    return torch.Generator(device).manual_seed(mixed_seed(seed))


def member_seed(seed: int, index: int) -> int:
    """The seed of member ``index`` (a sample, row, draw or case) of a set drawn with ``seed``:
    ``seed`` itself for the first, for every other a 63-bit hash of (seed, index). With
    ``seed + index`` sets drawn with neighbouring seeds shared all members but one (seed 1's
    first was seed 0's second); hashed, sets drawn with different seeds share none, and a member
    drawn alone with its own seed is still that member."""
    if index == 0:
        return seed
    return _hashed(f"member:{seed}:{index}")


def blanks_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of prompt guidance's blanks (the prior its unconditional pass sees) for a
    sample drawn with ``seed``: a stream of its own, not another sample's (``seed + 1`` was the
    next seed's sampling stream)."""
    return generator(_hashed(f"blanks:{seed}"), device)


def _hashed(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


@contextmanager
def seeded(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Torch's global stream seeded for evaluation seed ``seed`` (through ``mixed_seed``) for a
    block of code, for code that draws from it (a process's loss); the caller's stream is
    restored afterwards, so an evaluation inside training leaves training's draws as they were."""
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(mixed_seed(seed))
        yield


class Rows:
    """One generator per row of a batch (row b draws only from ``generators[b]``), so that a
    row's samples do not depend on what else is in its batch (``cdlm.generation.rows``).

    ``lengths``: each row's canvas length, the batch's width being the longest (shorter rows are
    padded on the right). A draw over the canvas (its dim 1 is the width) takes only the row's
    own ``lengths[b]`` positions from its generator, zeros standing in for the padding, so a row
    consumes its stream exactly as it would alone; any other draw takes the row's full slice.
    """

    def __init__(
        self, generators: list[torch.Generator], lengths: list[int], width: int | None = None
    ) -> None:
        if len(generators) != len(lengths):
            raise ValueError(f"{len(generators)} generators for {len(lengths)} rows")
        self.generators, self.lengths = generators, lengths
        self.width = max(lengths, default=0) if width is None else width

    def __len__(self) -> int:
        return len(self.generators)

    @property
    def device(self) -> torch.device:
        return self.generators[0].device

    def draw(self, fn, shape: tuple[int, ...], canvas: bool = True, **kw) -> torch.Tensor:
        """``fn(shape, generator=, **kw)`` row by row (see the class), stacked to ``shape``."""
        if shape[0] != len(self):
            raise ValueError(f"a draw of {shape[0]} rows from {len(self)} row generators")
        rows, own = [], tuple(shape[1:])
        for g, n in zip(self.generators, self.lengths, strict=True):
            if canvas and len(own) and own[0] == self.width and n < self.width:
                drawn = fn((n, *own[1:]), generator=g, **kw)
                drawn = torch.cat([drawn, drawn.new_zeros((own[0] - n, *own[1:]))])
            else:
                drawn = fn(own, generator=g, **kw)
            rows.append(drawn)
        return torch.stack(rows)


Draws = torch.Generator | Rows | None


def rand(shape, generator: Draws, canvas: bool = True, **kw) -> torch.Tensor:
    """``torch.rand(shape, generator=generator, **kw)``, or row by row from ``Rows``; ``canvas``
    False: a draw whose dim 1 is not the canvas (one per row and vocabulary entry)."""
    if isinstance(generator, Rows):
        return generator.draw(torch.rand, tuple(shape), canvas, **kw)
    return torch.rand(shape, generator=generator, **kw)


def randn(shape, generator: Draws, **kw) -> torch.Tensor:
    """``torch.randn``, or row by row from ``Rows`` (see ``rand``)."""
    if isinstance(generator, Rows):
        return generator.draw(torch.randn, tuple(shape), **kw)
    return torch.randn(shape, generator=generator, **kw)


def randint(high: int, shape, generator: Draws, **kw) -> torch.Tensor:
    """``torch.randint(0, high, shape)``, or row by row from ``Rows`` (see ``rand``)."""
    if isinstance(generator, Rows):
        return generator.draw(lambda s, **k: torch.randint(0, high, s, **k), tuple(shape), **kw)
    return torch.randint(0, high, shape, generator=generator, **kw)


def select(generator: Draws, rows: torch.Tensor) -> Draws:
    """The generators of the ``rows`` (a (B,) bool mask) that take part in a draw; a single
    generator stays itself."""
    if not isinstance(generator, Rows):
        return generator
    keep = rows.tolist()
    pick = [i for i, k in enumerate(keep) if k]
    lengths = [generator.lengths[i] for i in pick]
    return Rows([generator.generators[i] for i in pick], lengths, generator.width)


def window(generator: Draws, start: int, stop: int) -> Draws:
    """The generators for draws over canvas positions [start, stop) alone (a block): each row's
    real length counted inside the window, so a row whose canvas ends inside it draws as alone,
    where its last block is that much shorter."""
    if not isinstance(generator, Rows):
        return generator
    lengths = [min(max(n - start, 0), stop - start) for n in generator.lengths]
    return Rows(generator.generators, lengths, stop - start)
