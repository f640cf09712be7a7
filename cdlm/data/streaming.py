"""A corpus read as a stream (``data.streaming=true``): never whole in memory, resumable.

Documents come from ``datasets.load_dataset(..., streaming=True)`` (a Hub name, or local json,
jsonl, parquet or arrow files). Each is cleaned and tokenised as the in-memory path does (EOS
after every paragraph) and packed into ``seq_len`` sequences. A hash of each document's text
sends ``val_fraction`` of them to validation; training never sees those.

Sharding: every DataLoader worker of every rank is one *reader*. ``split_dataset_by_node`` gives
each reader its own files (when the readers divide the file count) or else every N-th document,
so each document, hence each sequence, reaches exactly one reader. A reader makes pass after pass
over its share (pass p shuffled by (seed, p) when ``shuffle_buffer`` > 0) while training asks.

Resume: a reader's sequences are a pure function of (data, seed, reader, readers), and the
DataLoader takes batches from its workers round-robin. So the state is the number of sequences
this rank has trained on (counted in ``TextDataModule.on_before_batch_transfer``), and a resumed
reader regenerates its stream and drops what it already gave. The cost: re-reading and
re-tokenising everything trained on so far (spread over the readers), not re-training.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator
from itertools import chain, count, islice
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from cdlm.data.corpus import clean_text
from cdlm.data.order import taken_of

BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow"}
COMPRESSION = (".gz", ".bz2", ".xz", ".zst")
DOCUMENTS_PER_READ = 256  # documents tokenised in one call (the fast tokenizer's batch)


def held_out(text: str, fraction: float) -> bool:
    """Whether a document belongs to validation. By content, so that the split needs no index,
    is the same in every shuffle and reader, and keeps duplicates on one side."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's token ids with EOS after every paragraph (line), as the in-memory packing."""
    if not texts:  # a tokenizer refuses an empty batch
        return []
    lines = [t.split("\n") for t in texts]
    ids = iter(tokenizer([p for ps in lines for p in ps], add_special_tokens=False)["input_ids"])
    eos = tokenizer.eos_token_id
    return [[i for _ in ps for i in [*next(ids), eos]] for ps in lines]


def pack(documents: Iterable[list[int]], seq_len: int) -> Iterator[list[int]]:
    """Consecutive ``seq_len`` windows of the concatenated documents; a tail shorter than
    ``seq_len`` waits for the next document (and is dropped if none comes)."""
    carry: list[int] = []
    for ids in documents:
        carry.extend(ids)
        while len(carry) >= seq_len:
            yield carry[:seq_len]
            del carry[:seq_len]


def _builder(file: Path) -> str | None:
    """The ``datasets`` builder that reads ``file`` (None: not a streamable file)."""
    name = file.name
    for suffix in COMPRESSION:
        name = name.removesuffix(suffix)
    return BUILDERS.get(Path(name).suffix)


def _local_files(path: Path) -> tuple[str, list[str]]:
    """(builder, files) of a local file or folder (searched recursively, sorted)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    files = [p for p in files if _builder(p)]
    kinds = sorted({_builder(p) for p in files})
    if len(kinds) != 1:
        found = f"mixed ({', '.join(kinds)})" if kinds else "no"
        raise ValueError(
            f"data.path={str(path)!r} has {found} streamable files: give .json, .jsonl, .parquet "
            "or .arrow files (optionally compressed), all of one kind"
        )
    return kinds[0], [str(p) for p in files]


@dataclasses.dataclass(frozen=True)
class StreamCorpus:
    """Where the documents come from, and which of them are held out.

    Args:
        path: a Hub dataset name, or a local file or folder (json, jsonl, parquet or arrow).
        subset: the Hub dataset's subset (config name), e.g. ``sample-10BT``.
        shuffle_buffer: each reader's shuffle buffer, in documents; 0 keeps the stream order.
    """

    path: str
    text_column: str = "text"
    subset: str | None = None
    split: str = "train"
    val_fraction: float = 0.02
    shuffle_buffer: int = 0
    seed: int = 0

    def open(self) -> Any:
        """The text column as a ``datasets.IterableDataset``, in stream order."""
        import datasets  # an optional dependency, needed here only

        local = Path(self.path).expanduser()
        if local.exists():
            builder, files = _local_files(local)
            ds = datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
        elif self.path.startswith(("/", ".", "~")):
            raise ValueError(f"data.path={self.path!r} does not exist")
        else:
            try:
                ds = datasets.load_dataset(self.path, self.subset, split=self.split, streaming=True)
            except (FileNotFoundError, ConnectionError) as e:  # e.g. DatasetNotFoundError, offline
                raise ValueError(f"data.path={self.path!r}: {e}") from None
        if ds.column_names is not None and self.text_column not in ds.column_names:
            raise ValueError(
                f"data.text_column={self.text_column!r} is not a column of data.path="
                f"{self.path!r}: {ds.column_names}"
            )
        return ds.select_columns([self.text_column])

    def documents(
        self,
        *,
        validation: bool = False,
        epoch: int | None = None,
        reader: int = 0,
        readers: int = 1,
        ds: Any = None,
    ) -> Iterator[list[str]]:
        """Lists of cleaned, non-empty texts: the training documents (with ``validation``, the
        held-out ones) of ``reader``'s share of ``ds`` (default: ``open()``), in stream order
        or, given a pass number ``epoch``, in that pass's order (the same in every reader)."""
        from datasets.distributed import split_dataset_by_node

        ds = self.open() if ds is None else ds
        if readers > 1:
            ds = split_dataset_by_node(ds, rank=reader, world_size=readers)
        if epoch is not None:  # after the split, which forgets the epoch
            if self.shuffle_buffer > 0:
                ds = ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
            ds.set_epoch(epoch)
        for batch in ds.iter(batch_size=DOCUMENTS_PER_READ):  # .iter: no per-worker split
            texts = (t for t in batch[self.text_column] if t)
            kept = (clean_text(t) for t in texts if held_out(t, self.val_fraction) == validation)
            yield [t for t in kept if t]


@dataclasses.dataclass(eq=False)
class PackedStream(IterableDataset):
    """The packed training sequences of one rank, split among its DataLoader workers.

    Yields ``{"tokens": (seq_len,) int64, "label": 0}``. ``taken`` is how many sequences this
    rank has trained on: every new iterator starts after them, as the uninterrupted run went on.

    Args:
        batch_size: the DataLoader's: worker w gave batches w, w + W, ... of this rank's stream.
        passes: None (training) reads the corpus again and again; a number stops after it.
    """

    corpus: StreamCorpus
    tokenizer: Any = dataclasses.field(repr=False)
    seq_len: int
    batch_size: int
    rank: int = 0
    world_size: int = 1
    passes: int | None = None
    taken: int = 0

    def shard(self, rank: int, world_size: int) -> PackedStream:
        """This stream for one rank of ``world_size``, from the start."""
        return dataclasses.replace(self, rank=rank, world_size=world_size, taken=0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        batches = self.taken // self.batch_size
        # A fresh DataLoader starts at worker 0, but the uninterrupted run's next batch came
        # from worker (batches mod W): each worker takes over the reader whose turn it is.
        role = (worker + batches) % workers
        done = (batches - role + workers - 1) // workers  # of batches 0..batches-1, role's
        reader, readers = self.rank * workers + role, self.world_size * workers
        for tokens in islice(self._sequences(reader, readers), done * self.batch_size, None):
            yield {"tokens": torch.tensor(tokens, dtype=torch.long), "label": 0}

    def _sequences(self, reader: int, readers: int) -> Iterator[list[int]]:
        ds = self.corpus.open()
        passes = count() if self.passes is None else range(self.passes)
        documents = chain.from_iterable(self._pass(ds, p, reader, readers) for p in passes)
        return pack(documents, self.seq_len)

    def _pass(self, ds: Any, epoch: int, reader: int, readers: int) -> Iterator[list[int]]:
        empty = True
        for texts in self.corpus.documents(epoch=epoch, reader=reader, readers=readers, ds=ds):
            empty = empty and not texts
            yield from encode(self.tokenizer, texts)
        if empty:  # else an endless stream would spin forever
            raise ValueError(
                f"reader {reader} of {readers} (world size x data.num_workers) got no training "
                f"document from data.path={self.corpus.path!r}: give more documents, or fewer "
                "workers"
            )


class StreamLoader(DataLoader):
    """A ``DataLoader`` over a ``PackedStream`` that Lightning sees as stateful (as
    ``order.ResumableLoader``): its checkpointed state is the rank's sequences taken."""

    def state_dict(self) -> dict[str, Any]:
        stream: PackedStream = self.dataset
        return {
            "taken": stream.taken,
            "seed": stream.corpus.seed,
            "seq_len": stream.seq_len,
            "batch_size": stream.batch_size,
            "world_size": stream.world_size,
            "workers": max(1, self.num_workers),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fix = "resume a streamed run with the same settings (workers: data.num_workers)"
        self.dataset.taken = taken_of(self.state_dict(), state, fix)


def held_out_sequences(corpus: StreamCorpus, tokenizer, seq_len: int, limit: int) -> torch.Tensor:
    """(N <= limit, seq_len) int64: the first held-out documents in stream order, packed."""
    documents = chain.from_iterable(
        encode(tokenizer, texts) for texts in corpus.documents(validation=True)
    )
    rows = list(islice(pack(documents, seq_len), limit))
    if not rows:
        raise ValueError(
            f"no validation sequence: the held-out data.val_fraction={corpus.val_fraction} of "
            f"data.path={corpus.path!r} has fewer than data.seq_len={seq_len} tokens"
        )
    return torch.tensor(rows, dtype=torch.long)


def first_documents(corpus: StreamCorpus, limit: int) -> list[str]:
    """The first ``limit`` training documents in stream order (a bounded sample)."""
    return list(islice(chain.from_iterable(corpus.documents()), limit))
