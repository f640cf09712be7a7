"""LightningDataModule: documents -> tokens -> fixed-length sequences with a label each, held in
memory, or with ``streaming`` read as a stream (``data/streaming.py``); or, with
``format=pairs``, one prompt→response row per example (``data/pairs.py``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from cdlm.data.corpus import Document, load_documents
from cdlm.data.order import BatchShards, ResumableLoader, ResumableSampler
from cdlm.data.pairs import PairDataset, encode_pairs, read_pairs
from cdlm.data.sequences import SequenceDataset
from cdlm.data.streaming import (
    PackedStream,
    StreamCorpus,
    StreamLoader,
    encode,
    first_documents,
    held_out_sequences,
)
from cdlm.data.tokenizer import corpus_bpe, pretrained

FORMATS = ("text", "pairs")


class RankedData(L.LightningDataModule):
    """What a data module of fixed-length sequences does the same whatever its source: its
    rank, the end of a fit, and validation batches sharded whole across processes. Subclasses
    set ``tokenizer``, ``val_set``, ``batch_size``, ``num_workers``, ``order`` and ``stream``."""

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def _rank(self) -> tuple[int, int]:
        """(global rank, world size) of this process: (0, 1) outside a distributed fit."""
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer else (0, 1)

    def teardown(self, stage: str) -> None:
        if stage == "fit":  # a later fit starts its own order (a resumed one loads its state)
            self.order = self.stream = None

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        # several processes: whole batches of the one-process batching, none repeated
        shards = BatchShards(len(self.val_set), self.batch_size, rank, world) if world > 1 else None
        return DataLoader(
            self.val_set, batch_size=self.batch_size, sampler=shards, num_workers=self.num_workers
        )


class TextDataModule(RankedData):
    """Tokenises a corpus into fixed-length sequences and splits them deterministically.

    Args:
        path: None (bundled Austen), a .txt file, a folder of .txt files, or a HF dataset name.
        tokenizer: None to train (once, cached) a byte-level BPE of ``vocab_size`` on the corpus,
            or any HF tokenizer name/path.
        seq_len: tokens per sequence.
        packing: True packs each document into consecutive full sequences (EOS after every
            paragraph); False gives one paragraph per sequence, cut or padded with PAD after EOS.
        val_fraction: the last fraction of each document's sequences is held out (contiguous, so
            no validation text leaks into training through overlapping context).
        seed: the training order's seed (``cdlm-train`` passes its ``seed``); each epoch is a
            fixed shuffle of it, and a checkpoint records how far into the epoch training got, so
            a resumed run sees the batches the uninterrupted run would have (``data/order.py``).
        streaming: read ``path`` (a Hub dataset, or local json/jsonl/parquet/arrow files) as a
            stream, never whole (docs/guide/streaming.md). Then ``val_fraction`` is the share of
            documents held out (by a hash of their text), ``val_sequences`` caps the validation
            set, the corpus BPE and unigram prior come from the first ``sample_documents``, and
            there are no labels.
        format: ``text`` (documents, as above) or ``pairs``: ``path`` is a JSONL file of
            prompt→response pairs, one row each, the prompt marked (``data/pairs.py``); the last
            ``val_fraction`` of the pairs is held out, and there are no labels.
        subset, split: the Hub dataset's subset (config name) and split.
        shuffle_buffer: streaming: documents shuffled together in each reader (0: stream order).
        train_size: None: every training sequence; an int: a fixed random sample of that many,
            the same whatever the run's seed or process (data-constrained runs over many epochs).
    """

    def __init__(
        self,
        path: str | None = None,
        tokenizer: str | None = None,
        vocab_size: int = 8192,
        seq_len: int = 128,
        batch_size: int = 32,
        packing: bool = True,
        val_fraction: float = 0.02,
        num_workers: int = 0,
        cache_dir: str | None = None,
        text_column: str = "text",
        label_column: str | None = None,
        seed: int = 0,
        streaming: bool = False,
        subset: str | None = None,
        split: str = "train",
        val_sequences: int = 256,
        sample_documents: int = 10_000,
        shuffle_buffer: int = 0,
        format: str = "text",
        train_size: int | None = None,
    ) -> None:
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"unknown data.format {format!r}; valid: {', '.join(FORMATS)}")
        if format == "pairs" and streaming:
            raise ValueError("data.format=pairs reads its file whole: data.streaming must be false")
        if train_size is not None and (streaming or format == "pairs"):
            raise ValueError("data.train_size samples in-memory text: not with streaming or pairs")
        if seq_len < 2:
            raise ValueError(f"data.seq_len must be >= 2, got {seq_len}")
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
        self.path, self.tokenizer_name, self.vocab_size_target = path, tokenizer, vocab_size
        self.seq_len, self.batch_size, self.packing = seq_len, batch_size, packing
        self.val_fraction, self.num_workers = val_fraction, num_workers
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.text_column, self.label_column = text_column, label_column
        self.seed = seed
        self.streaming, self.subset, self.split = streaming, subset, split
        self.val_sequences, self.sample_documents = val_sequences, sample_documents
        self.shuffle_buffer, self.format, self.train_size = shuffle_buffer, format, train_size
        self.order: ResumableSampler | None = None
        self.stream: PackedStream | None = None  # this rank's, when streaming
        self.unigram_sample: torch.Tensor | None = None
        self.tokenizer = None
        self.labels: list[str] = []
        self.train_set: SequenceDataset | PairDataset | PackedStream | None = None
        self.val_set: SequenceDataset | PairDataset | None = None

    def use_tokenizer(self, tokenizer) -> None:
        """Tokenise with ``tokenizer`` (a model's own) instead of building one; before setup."""
        self.tokenizer = tokenizer

    def held_specials(self) -> list[int]:
        """The special ids the rows hold at scored positions: EOS, which every format writes
        (after each packed paragraph, each unpacked one, each response); PAD is never scored."""
        return [self.tokenizer.eos_token_id]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.streaming:
            self._setup_stream()
            return
        if self.format == "pairs":
            self._setup_pairs()
            return
        docs = load_documents(self.path, self.text_column, self.label_column, self.split)
        if self.tokenizer is None:  # else given by use_tokenizer (e.g. a teacher's)
            self.tokenizer = (
                pretrained(self.tokenizer_name)
                if self.tokenizer_name
                else corpus_bpe(docs, self.vocab_size_target, self.cache_dir)
            )
        self.labels = sorted({d.label for d in docs})
        train, val = [], []
        for doc in docs:
            seqs = self._sequences(doc)
            n_val = max(1, round(len(seqs) * self.val_fraction)) if len(seqs) > 1 else 0
            train += [(s, doc.label) for s in seqs[: len(seqs) - n_val]]
            val += [(s, doc.label) for s in seqs[len(seqs) - n_val :]]
        if not train or not val:
            raise ValueError(
                f"corpus too small: {len(train)} train / {len(val)} val sequences of "
                f"{self.seq_len} tokens; give more text or a smaller data.seq_len"
            )
        if self.train_size is not None:  # seeded apart from the run: every run sees the same
            if not 1 <= self.train_size <= len(train):
                raise ValueError(
                    f"data.train_size must be in [1, {len(train)}], got {self.train_size}"
                )
            keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
            train = [train[i] for i in keep[: self.train_size].tolist()]
        self.train_set, self.val_set = self._dataset(train), self._dataset(val)

    def _setup_pairs(self) -> None:
        """One row per pair; the last ``val_fraction`` of the pairs (at least one) held out."""
        if self.tokenizer is None and self.tokenizer_name:
            self.tokenizer = pretrained(self.tokenizer_name)
        pairs = read_pairs(self.path, self.tokenizer)  # a chat template needs the tokenizer
        if self.tokenizer is None:
            texts = [Document(f"{p.prompt}\n{p.response}", "") for p in pairs]
            self.tokenizer = corpus_bpe(texts, self.vocab_size_target, self.cache_dir)
        n_val = max(1, round(len(pairs) * self.val_fraction))
        if len(pairs) - n_val < 1:
            raise ValueError(f"data.path={self.path} holds {len(pairs)} pair(s); give at least 2")
        rows = [pairs[: len(pairs) - n_val], pairs[len(pairs) - n_val :]]
        self.train_set, self.val_set = (
            PairDataset(encode_pairs(self.tokenizer, part, self.seq_len)) for part in rows
        )

    def _setup_stream(self) -> None:
        for ok, problem in (
            (self.path is not None, "needs data.path: a Hub dataset or local json/parquet files"),
            (self.packing, "packs its sequences: data.packing=false is not supported"),
            (self.label_column is None, "reads no labels: data.label_column must be null"),
        ):
            if not ok:
                raise ValueError(f"data.streaming=true {problem}")
        for key, value in (
            ("val_sequences", self.val_sequences),
            ("sample_documents", self.sample_documents),
        ):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"data.{key} must be an integer >= 1, got {value!r}")
        corpus = StreamCorpus(
            self.path,
            self.text_column,
            self.subset,
            self.split,
            self.val_fraction,
            self.shuffle_buffer,
            self.seed,
        )
        sample = first_documents(corpus, self.sample_documents)
        if not sample:
            raise ValueError(f"data.path={self.path!r} holds no training document")
        if self.tokenizer is None:
            self.tokenizer = (
                pretrained(self.tokenizer_name)
                if self.tokenizer_name
                else corpus_bpe(
                    [Document(t, "") for t in sample], self.vocab_size_target, self.cache_dir
                )
            )
        ids = [i for doc in encode(self.tokenizer, sample) for i in doc]
        self.unigram_sample = torch.tensor(ids, dtype=torch.long)
        val = held_out_sequences(corpus, self.tokenizer, self.seq_len, self.val_sequences)
        self.val_set = SequenceDataset(val, torch.zeros(len(val), dtype=torch.long))
        self.train_set = PackedStream(corpus, self.tokenizer, self.seq_len, self.batch_size)

    def _sequences(self, doc: Document) -> list[list[int]]:
        n = self.seq_len
        if self.packing:
            stream = encode(self.tokenizer, [doc.text])[0]
            return [stream[k : k + n] for k in range(0, len(stream) - n + 1, n)]
        tok, eos = self.tokenizer, self.tokenizer.eos_token_id
        paragraphs = tok(doc.text.split("\n"), add_special_tokens=False)["input_ids"]
        pad = tok.pad_token_id
        return [(p[: n - 1] + [eos] + [pad] * n)[:n] for p in paragraphs if p]

    def _dataset(self, rows: list[tuple[list[int], str]]) -> SequenceDataset:
        index = {name: i for i, name in enumerate(self.labels)}
        tokens = torch.tensor([r[0] for r in rows], dtype=torch.long)
        pad = None if self.packing else self.tokenizer.pad_token_id
        return SequenceDataset(tokens, torch.tensor([index[r[1]] for r in rows]), pad)

    def log_unigram(self) -> torch.Tensor:
        """(V,) log-frequencies of the training tokens (add-one smoothed): the no-context
        readout that training diagnostics compare the model against. Streamed: of the first
        ``sample_documents`` training documents."""
        tokens = self.unigram_sample if self.streaming else self.train_set.counted_tokens()
        counts = torch.bincount(tokens, minlength=self.vocab_size)
        counts = counts.double() + 1.0
        return (counts / counts.sum()).log().float()

    def train_dataloader(self) -> DataLoader:
        options = {
            "batch_size": self.batch_size,
            "drop_last": True,
            "num_workers": self.num_workers,
        }
        if self.streaming:
            if self.stream is None:  # this rank's share, from the start (or a checkpoint's state)
                self.stream = self.train_set.shard(*self._rank())
            return StreamLoader(self.stream, **options)
        if self.order is None:  # one order for the whole fit, whatever reloads the loader
            rank, world = self._rank()
            self.order = ResumableSampler(
                len(self.train_set), self.seed, rank, world, self.batch_size
            )
        return ResumableLoader(self.train_set, sampler=self.order, **options)

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        # Lightning calls this for the batch about to be trained on (the one fetched ahead is not
        # counted yet), so the saved position is the first sequence not yet seen.
        if self.order is not None and self.trainer is not None and self.trainer.training:
            self.order.taken += len(batch["tokens"]) * self.trainer.world_size  # all ranks' share
        if self.stream is not None and self.trainer is not None and self.trainer.training:
            self.stream.taken += len(batch["tokens"])  # this rank's own: no rank shares a stream
        return batch
