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
from torch.utils.data import DataLoader, DistributedSampler


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` of the run seeded ``seed``: unrelated streams for
    neighbouring epochs and seeds, and none that a small training seed would equal."""
    digest = hashlib.blake2b(f"data-order:{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ResumableSampler(DistributedSampler):
    """A shuffle of ``range(size)`` per epoch whose position survives a checkpoint, and whose
    split over ranks is the single-process batching: a run on ``world_size`` processes with
    ``batch_size`` each sees, step by step, the sequences one process sees with
    ``world_size * batch_size`` (rank r takes the r-th slice of every global batch), so a DDP run
    and a one-process run are the same optimisation (tests/test_distributed.py).

    Lightning calls ``set_epoch`` at every epoch start; ``taken`` counts the sequences training
    has consumed this epoch over all ranks, and iteration starts after them, so a checkpoint
    resumes on any number of processes. A ``DistributedSampler`` subclass so that Lightning
    keeps it instead of substituting its own, which would neither resume nor batch the same.
    """

    def __init__(
        self, size: int, seed: int = 0, rank: int = 0, world_size: int = 1, batch_size: int = 1
    ) -> None:
        super().__init__(range(size), num_replicas=world_size, rank=rank, shuffle=False)
        self.size, self.seed, self.batch_size = size, seed, batch_size
        self.epoch, self.taken = 0, 0

    @property
    def global_batch(self) -> int:
        return self.num_replicas * self.batch_size

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(self.size, generator=generator).tolist()

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.taken = epoch, 0

    def __iter__(self) -> Iterator[int]:
        rest = self.order(self.epoch)[self.taken :]
        if self.num_replicas == 1:
            yield from rest
            return
        g, b, r = self.global_batch, self.batch_size, self.rank
        for start in range(0, len(rest) - g + 1, g):  # whole global batches only
            yield from rest[start + r * b : start + (r + 1) * b]

    def __len__(self) -> int:
        # the full epoch: Lightning counts a resumed epoch's batches itself
        if self.num_replicas == 1:
            return self.size
        return self.size // self.global_batch * self.batch_size

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


class BatchShards(DistributedSampler):
    """Validation order for ``world_size`` processes: whole batches of the single-process
    batching, batch k on rank k % world_size, no sequence repeated (Lightning's default pads
    ranks with repeats). With the batch's noise keyed on its global index
    (``global_batch_index``) and metrics reduced across ranks, validation on several processes
    gives the one-process figures."""

    def __init__(self, size: int, batch_size: int, rank: int, world_size: int) -> None:
        super().__init__(range(size), num_replicas=world_size, rank=rank, shuffle=False)
        self.size, self.batch_size = size, batch_size

    def __iter__(self) -> Iterator[int]:
        for start in range(self.rank * self.batch_size, self.size, self.global_batch):
            yield from range(start, min(start + self.batch_size, self.size))

    @property
    def global_batch(self) -> int:
        return self.num_replicas * self.batch_size

    def __len__(self) -> int:
        return sum(1 for _ in self)


def global_batch_index(batch_idx: int, rank: int, world_size: int) -> int:
    """The single-process index of a rank's ``batch_idx``-th validation batch (``BatchShards``)."""
    return batch_idx * world_size + rank


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
        whole = sampler.global_batch if sampler.num_replicas > 1 else self.batch_size
        if left <= 0 or ((self.drop_last or sampler.num_replicas > 1) and left < whole):
            # saved after the epoch's last batch: the resumed run starts the next epoch
            sampler.epoch, sampler.taken = sampler.epoch + 1, 0


def taken_of(current: dict[str, Any], saved: dict[str, Any], fix: str) -> int:
    """The ``taken`` count of a checkpointed loader ``saved``, once its other keys match this
    run's ``current`` state (the same data drawn or read the same way); else a ``ValueError``
    naming both and ``fix``."""
    mine = {k: v for k, v in current.items() if k != "taken"}
    theirs = {k: saved.get(k) for k in mine}
    if theirs != mine:
        raise ValueError(
            f"the checkpoint's data was made as {theirs}, this run makes it as {mine}: {fix}"
        )
    return saved["taken"]
