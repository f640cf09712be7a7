"""Module modes switched for a block of code and always switched back (STYLE rule 6)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Eval mode for ``modules`` (no dropout, no attention annealing), each restored to the mode
    it had, also on error: sampling and evaluation run from inside training callbacks."""
    was = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, training in zip(modules, was, strict=True):
            m.train(training)
