"""Training data from an exact world (``data=world:<name>``): fresh exact samples for every batch,
or a fixed finite set of them, and a fixed set of exact validation samples.

Every draw is a pure function of a key (``stream_seed``), never of a generator's running state:
fresh training batch k of rank r comes from (seed, r, k), so a resumed run continues each rank's
stream exactly, whatever its DataLoader workers; the finite set from (seed); the validation set
from the world and length alone, so that every run of a world is validated on the same sequences,
and on every rank. A stand-in for ``cdlm.data.TextDataModule``: worlds are unconditional (no
labels), and the tokenizer is the world's. A share of the training rows may carry a ``prompt``
(``data.prompt_rate``, ``cdlm.worlds.prompt_rows``), its marks keyed as the tokens are; the
validation set has none, so that its bound stays the unconditional one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Iterator
from itertools import count
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from cdlm.data.datamodule import RankedData
from cdlm.data.order import ResumableLoader, ResumableSampler, taken_of
from cdlm.data.sequences import SequenceDataset
from cdlm.worlds import PREFIX, is_world, load, names, options
from cdlm.worlds.base import NEVER, World
from cdlm.worlds.prompt_rows import SHAPES, PromptRows


def stream_seed(*key: object) -> int:
    """A 63-bit seed for ``key`` (e.g. ("fresh", seed, rank, batch)): unrelated streams for
    neighbouring keys, and none shared between training and validation."""
    text = ":".join(["world-data", *map(str, key)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def draw(world: World, n: int, seq_len: int, *key: object) -> torch.Tensor:
    """(n, seq_len) int64 exact samples of ``world``, a pure function of ``key``."""
    generator = torch.Generator().manual_seed(stream_seed(*key))
    return world.sample(n, seq_len, generator=generator)


def prompts(rows: PromptRows, n: int, seq_len: int, *key: object) -> torch.Tensor:
    """(n, seq_len) bool prompt marks (``PromptRows.mark``), a pure function of ``key``."""
    return rows.mark(n, seq_len, torch.Generator().manual_seed(stream_seed("prompt", *key)))


@dataclasses.dataclass(eq=False)
class FreshBatches(IterableDataset):
    """One rank's endless stream of whole batches ``{"tokens": (batch_size, seq_len) int64,
    "label": (batch_size,) zeros}`` (and ``"prompt"``: (batch_size, seq_len) bool when
    ``rows`` are on), batch k drawn anew from (seed, rank, k). ``taken`` is how
    many batches this rank has trained on: every new iterator starts after them. DataLoader
    worker w of W yields batches taken + w, taken + w + W, ..., which the loader interleaves
    back into stream order."""

    world: World = dataclasses.field(repr=False)
    spec: str
    seq_len: int
    batch_size: int
    seed: int
    rank: int = 0
    taken: int = 0
    rows: PromptRows = PromptRows()

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        key = ("fresh", self.seed, self.rank, k)
        tokens = draw(self.world, self.batch_size, self.seq_len, *key)
        out = {"tokens": tokens, "label": torch.zeros(self.batch_size, dtype=torch.long)}
        if self.rows.on:
            out["prompt"] = prompts(self.rows, self.batch_size, self.seq_len, *key)
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for k in count(self.taken + worker, workers):
            yield self.batch(k)


class FreshLoader(DataLoader):
    """A ``DataLoader`` (``batch_size=None``: the dataset batches) over ``FreshBatches`` that
    Lightning sees as stateful, as ``order.ResumableLoader``: its checkpointed state is the
    batches taken. A resume on another number of processes is allowed: each rank continues its
    own stream (or starts one), so no batch repeats."""

    def state_dict(self) -> dict[str, Any]:
        stream: FreshBatches = self.dataset
        return {
            "taken": stream.taken,
            "world": stream.spec,
            "seed": stream.seed,
            "seq_len": stream.seq_len,
            "batch_size": stream.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.taken = taken_of(
            self.state_dict(), state, "resume with the same data and seed"
        )


class WorldData(RankedData):
    """Exact samples of a world (``cdlm.worlds``) as training and validation sequences.

    Args:
        world: the world, ``world:<name>`` (conf/world/).
        world_options: its options (``data.world_options.path=corpus.txt``: the world fitted on
            that corpus); None or unset ones: the conf file's.
        seq_len: tokens per sequence; None: the world's own length.
        batch_size: sequences per batch (per process).
        train_size: None: fresh samples forever, each batch drawn anew; an int: a fixed finite
            set of that many sequences, shuffled each epoch (``order.ResumableSampler``).
        val_size: validation sequences, drawn from a key of their own (not the seed): the same
            for every run of the world at this length, and on every rank.
        seed: the training draws' seed (``cdlm-train`` passes its ``seed``).
        num_workers: DataLoader workers.
        prompt_rate: the share of training rows whose fixed positions are marked ``prompt``
            (``cdlm.worlds.prompt_rows``): 0, none (unconditional training).
        prompt_shapes: the shapes those rows draw among: ``prefix`` and/or ``infill``.
    """

    def __init__(
        self,
        world: str = "world:chars",
        world_options: dict | None = None,
        seq_len: int | None = None,
        batch_size: int = 32,
        train_size: int | None = None,
        val_size: int = 256,
        seed: int = 0,
        num_workers: int = 0,
        prompt_rate: float = 0.0,
        prompt_shapes: list[str] | tuple[str, ...] = SHAPES,
    ) -> None:
        super().__init__()
        self.rows = PromptRows(prompt_rate, tuple(prompt_shapes))
        if not is_world(world) or world[len(PREFIX) :] not in names():
            valid = ", ".join(PREFIX + n for n in names())
            raise ValueError(f"unknown data.world {world!r}; valid: {valid} (conf/world/)")
        self.world_options = options(world, world_options)
        for key, value, least in (
            ("seq_len", seq_len, 2),
            ("batch_size", batch_size, 1),
            ("train_size", train_size, batch_size),
            ("val_size", val_size, 1),
        ):
            if value is not None and not (isinstance(value, int) and value >= least):
                raise ValueError(f"data.{key} must be an integer >= {least}, got {value!r}")
        self.world, self.seq_len, self.batch_size = world, seq_len, batch_size
        self.train_size, self.val_size = train_size, val_size
        self.seed, self.num_workers = seed, num_workers
        self.labels: list[str] = []  # worlds are unconditional
        self.tokenizer = None
        self.given_tokenizer = None
        self.source: World | None = None
        self.train_set: SequenceDataset | FreshBatches | None = None
        self.val_set: SequenceDataset | None = None
        self.order: ResumableSampler | None = None  # a finite set's order, for the whole fit
        self.stream: FreshBatches | None = None  # this rank's, with fresh samples

    def held_specials(self) -> list[int]:
        """None: a world emits none of its tokenizer's special tokens."""
        return []

    def use_tokenizer(self, tokenizer) -> None:
        """Accept ``tokenizer`` (a teacher's) if it is the world's own; before setup."""
        self.given_tokenizer = tokenizer

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        world = self.source = load(self.world, **self.world_options)
        self.seq_len = self.seq_len or world.length
        # a copy: a process that adds tokens (FIM sentinels) must not change the cached world's
        self.tokenizer = self._checked(self.given_tokenizer) or copy.deepcopy(world.tokenizer)
        val = draw(world, self.val_size, self.seq_len, "val", self.world)
        self.val_set = SequenceDataset(val, torch.zeros(len(val), dtype=torch.long))
        if self.train_size is None:
            self.train_set = FreshBatches(
                world, self.world, self.seq_len, self.batch_size, self.seed, rows=self.rows
            )
        else:
            train = draw(world, self.train_size, self.seq_len, "set", self.seed)
            marks = prompts(self.rows, len(train), self.seq_len, "set", self.seed)
            self.train_set = SequenceDataset(
                train,
                torch.zeros(len(train), dtype=torch.long),
                prompt=marks if self.rows.on else None,
            )

    def _checked(self, tokenizer):
        """``tokenizer`` if it is the world's (same vocabulary and special tokens), else a
        ValueError; None stays None."""
        if tokenizer is None:
            return None
        if not self.source.speaks(tokenizer):
            own = self.source.tokenizer
            raise ValueError(
                f"data.world={self.world} trains on the world's own tokenizer ({len(own)} "
                f"tokens); the given one ({len(tokenizer)} tokens: a base model's or a teacher's "
                "of other data) differs"
            )
        return tokenizer

    def log_unigram(self) -> torch.Tensor:
        """(V,) the world's exact token marginal, averaged over the ``seq_len`` positions (the
        limit of the training tokens' frequencies); tokens it never emits get ``NEVER``."""
        marginal = self.source.token_marginals(self.seq_len).mean(0)
        out = torch.full((self.vocab_size,), NEVER)
        out[: marginal.numel()] = marginal.log().clamp_min(NEVER).float()
        return out

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        if self.train_size is None:
            if self.stream is None:  # this rank's, from the start (or a checkpoint's state)
                self.stream = dataclasses.replace(self.train_set, rank=rank, taken=0)
            return FreshLoader(self.stream, batch_size=None, num_workers=self.num_workers)
        if self.order is None:  # one order for the whole fit, whatever reloads the loader
            self.order = ResumableSampler(self.train_size, self.seed, rank, world, self.batch_size)
        return ResumableLoader(
            self.train_set,
            sampler=self.order,
            batch_size=self.batch_size,
            drop_last=True,
            num_workers=self.num_workers,
        )

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        # as TextDataModule: counted when about to be trained on, not when fetched ahead
        if self.trainer is not None and self.trainer.training:
            if self.order is not None:
                self.order.taken += len(batch["tokens"]) * self.trainer.world_size
            if self.stream is not None:
                self.stream.taken += 1  # this rank's own batches: no rank shares a stream
        return batch
