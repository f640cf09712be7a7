"""A training data order that resumes mid-epoch exactly where a checkpoint left it.

Lightning saves the ``state_dict`` of any training dataloader that has one in its checkpoints and
hands it back to ``load_state_dict`` before the first batch of a resumed run. A plain shuffled
``DataLoader`` has none, so a resumed run replays its epoch from the start, in a new order. Here
epoch e's order is a pure function of (seed, e), and the state is the epoch and how many of its
samples training has taken. Taken, not drawn: Lightning fetches a batch ahead of the one it
trains on, so the datamodule counts the batches that reach the model
(``TextDataModule.on_before_batch_transfer``) and the sampler's own position would run ahead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` of the run seeded ``seed``: unrelated streams for
    neighbouring epochs and seeds, and none that a small training seed would equal."""
    digest = hashlib.blake2b(f"data-order:{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ResumableSampler(Sampler[int]):
    """A shuffle of ``range(size)`` per epoch whose position survives a checkpoint.

    Lightning calls ``set_epoch`` at every epoch start; ``taken`` counts the samples training has
    consumed this epoch, and iteration starts after them.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed = size, seed
        self.epoch, self.taken = 0, 0

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(self.size, generator=generator).tolist()

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.taken = epoch, 0

    def __iter__(self) -> Iterator[int]:
        yield from self.order(self.epoch)[self.taken :]

    def __len__(self) -> int:
        return self.size  # the full epoch: Lightning counts a resumed epoch's batches itself

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "taken": self.taken, "size": self.size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != self.size or state["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint's data order is for {state['size']} training sequences with seed "
                f"{state['seed']}, this run has {self.size} with seed {self.seed}: resume with the "
                "same data and seed"
            )
        self.epoch, self.taken = state["epoch"], state["taken"]


class ResumableLoader(DataLoader):
    """A ``DataLoader`` over a ``ResumableSampler`` that Lightning sees as stateful: its state is
    saved in every checkpoint and restored before the resumed run draws a batch. No new
    constructor arguments, so Lightning can re-create it like any ``DataLoader``."""

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        sampler: ResumableSampler = self.sampler
        sampler.load_state_dict(state)
        left = sampler.size - sampler.taken
        if left <= 0 or (self.drop_last and left < self.batch_size):
            # saved after the epoch's last batch: the resumed run starts the next epoch
            sampler.epoch, sampler.taken = sampler.epoch + 1, 0
