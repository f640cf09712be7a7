"""Tokenizers: any Hugging Face tokenizer, or by default a byte-level BPE trained on the corpus
once and cached on disk (training takes seconds; the cache key is the corpus hash and size)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from cdlm.data.corpus import Document
from cdlm.io import atomic_write_text

SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "<eos>", "mask_token": "<mask>"}


def default_cache_dir() -> Path:
    return Path(os.environ.get("CDLM_CACHE", Path.home() / ".cache" / "cdlm"))


def train_bpe(docs: list[Document], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style): no unknown tokens, any text round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((line for d in docs for line in d.text.split("\n")), trainer)
    return tok


def wrap(
    tokenizer_json: str, special_tokens: dict[str, str] | None = None
) -> PreTrainedTokenizerFast:
    """A serialised ``tokenizers`` JSON as a transformers tokenizer (how checkpoints carry it)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json), **(special_tokens or SPECIAL_TOKENS)
    )


def serialise(tok: PreTrainedTokenizerBase) -> tuple[str, dict[str, str]]:
    """(tokenizer JSON, special-token map): all a checkpoint needs to rebuild ``tok``."""
    return tok.backend_tokenizer.to_str(), {k: getattr(tok, k) for k in SPECIAL_TOKENS}


def corpus_bpe(
    docs: list[Document], vocab_size: int, cache_dir: Path | None = None
) -> PreTrainedTokenizerFast:
    """The corpus's own BPE, trained on first use and loaded from the cache afterwards."""
    digest = hashlib.sha256()
    for d in docs:
        digest.update(d.text.encode())
    path = (
        (cache_dir or default_cache_dir())
        / "tokenizers"
        / (f"bpe{vocab_size}-{digest.hexdigest()[:16]}.json")
    )
    if not path.exists():
        atomic_write_text(path, train_bpe(docs, vocab_size).to_str())
    return wrap(path.read_text(encoding="utf-8"))


def pretrained(name_or_path: str) -> PreTrainedTokenizerBase:
    """Any HF tokenizer; adds pad/eos/mask tokens where it lacks them (e.g. GPT-2 has no pad)."""
    return with_specials(AutoTokenizer.from_pretrained(name_or_path))


def with_specials(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tok`` with cdlm's pad/eos/mask tokens added where it has none (in place): a pretrained
    model's tokenizer gets [MASK] this way, and the model's embeddings grow to match."""
    missing = {k: v for k, v in SPECIAL_TOKENS.items() if getattr(tok, k) is None}
    if missing:
        tok.add_special_tokens(missing)
    return tok


def for_base(tok: PreTrainedTokenizerBase, mask: bool) -> PreTrainedTokenizerBase:
    """A pretrained model's tokenizer made ready for a process (in place): padding is its EOS
    where it has none, and a [MASK] token is added only when the process needs one, so that an
    AR model keeps the base's vocabulary (and its logits) exactly."""
    if tok.eos_token is None:
        raise ValueError("the base's tokenizer has no EOS token, which cdlm's data needs")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if mask and tok.mask_token is None:
        tok.add_special_tokens({"mask_token": SPECIAL_TOKENS["mask_token"]})
    return tok
