"""A multi-process run whose peer died: the survivors' collective fails at once (gloo and NCCL
see the broken connection), and the run ends with one line instead of a traceback per rank."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L
import torch.distributed as dist

# what the backends' errors name: gloo's "Connection reset/closed by peer", NCCL's watchdog
BACKENDS = ("gloo", "nccl", "processgroup", "connection reset", "connection closed")


def lost_peer(error: BaseException, rank: int, world_size: int) -> str | None:
    """One line for an error that means another process of the run died or stopped answering,
    or None for any other error (which keeps its traceback)."""
    if world_size < 2 or not isinstance(error, RuntimeError):
        return None
    text = str(error)
    if not isinstance(error, dist.DistError) and not any(b in text.lower() for b in BACKENDS):
        return None
    cause = text.split("]", 1)[-1].strip().split(". ")[0]  # gloo prefixes its source line
    return (
        f"rank {rank} of {world_size}: another process of this run died or stopped answering "
        f"({cause}); every checkpoint written is whole: rerun the command with resume=auto"
    )


class PeerLost(RuntimeError):
    """Another process of the run died: its message is the one line to print."""


@contextmanager
def peer_loss_named(trainer: L.Trainer) -> Iterator[None]:
    """Re-raises a collective's error after a peer died as ``PeerLost``; others pass through."""
    try:
        yield
    except RuntimeError as e:
        if (line := lost_peer(e, trainer.global_rank, trainer.world_size)) is None:
            raise
        raise PeerLost(line) from None
