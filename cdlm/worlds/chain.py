"""First-order Markov chains fitted on real text: over characters and over a tokenizer's tokens.

The construction is Tang et al.'s (ICML 2026, LuhanTang/dllm_sampler): transition counts plus
additive smoothing, optionally only each row's top K successors kept, renormalised and mixed
with a teleport to the unigram distribution at rate ``teleport``; the first token is drawn from
the chain's stationary distribution. The character chain over the bundled Austen novels
(lowercased to a-z and space) stands in for their text8 chain.
"""

from __future__ import annotations

import re

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from torch import Tensor
from transformers import PreTrainedTokenizerFast

from cdlm.data.corpus import load_documents
from cdlm.data.tokenizer import SPECIAL_TOKENS, corpus_bpe
from cdlm.worlds.base import World
from cdlm.worlds.reference import ChainReference
from cdlm.worlds.transition import Transition

ALPHABET = " abcdefghijklmnopqrstuvwxyz"


def symbol_tokenizer(symbols: list[str]) -> PreTrainedTokenizerFast:
    """One token per character: cdlm's pad, eos and mask tokens (ids 0-2), then ``symbols``
    (single characters) from id 3. Characters outside them read as <pad>, which no world
    emits, so an oracle refuses them as evidence."""
    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials + symbols)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["pad_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)


def letters(text: str) -> str:
    """text8's normalisation: lowercase, every run of other characters one space."""
    return re.sub(r"[^a-z]+", " ", text.lower()).strip()


def pair_counts(ids: Tensor, size: int) -> Tensor:
    """(size, size) float64 counts of consecutive pairs in the stream ``ids`` (L,), or within
    each row of ``ids`` (N, L)."""
    flat = (ids[..., :-1] * size + ids[..., 1:]).reshape(-1)
    return torch.bincount(flat, minlength=size * size).view(size, size).double()


def stationary(step: Transition, tol: float = 1e-13, max_iter: int = 100_000) -> Tensor:
    """The stationary distribution (S,) of an ergodic chain, by power iteration in float64."""
    pi = torch.full((1, step.size), 1.0 / step.size, dtype=torch.float64)
    for _ in range(max_iter):
        nxt = step.push(pi)
        nxt = nxt / nxt.sum()
        if (nxt - pi).abs().sum() < tol:
            return nxt[0]
        pi = nxt
    raise ValueError("the chain's stationary distribution did not converge (is it periodic?)")


def fit_transition(
    counts: Tensor,
    smoothing: float,
    top_k: int | None = None,
    teleport: float = 0.0,
    temperature: float = 1.0,
) -> Transition:
    """The chain of ``counts`` (S, S): (counts + smoothing) per row, sharpened to the power
    1 / ``temperature`` (below 1: each row's likeliest successors gain, so that several tokens
    ahead stay guessable), then optionally the top K successors of each row (renormalised)
    mixed with the unigram at rate ``teleport``."""
    if smoothing < 0 or not 0.0 <= teleport < 1.0 or not temperature > 0:
        raise ValueError(
            "need smoothing >= 0, teleport in [0, 1) and temperature > 0, got "
            f"{smoothing}, {teleport}, {temperature}"
        )
    p = counts.double() + smoothing
    if (p.sum(-1) == 0).any():
        raise ValueError("a symbol has no successors and smoothing is 0: give smoothing > 0")
    p = p / p.sum(-1, keepdim=True)
    if temperature != 1.0:  # in logs: the powers of small probabilities underflow
        p = torch.softmax(p.log() / temperature, dim=-1)
    size = counts.shape[0]
    if (top_k is None or top_k >= size) and teleport == 0.0:
        return Transition(p)
    prob, index = p.topk(min(top_k or size, size), dim=-1)
    unigram = counts.double().sum(0) + smoothing
    return Transition(
        index=index,
        prob=prob / prob.sum(-1, keepdim=True),
        teleport=unigram / unigram.sum(),
        eps=teleport,
    )


class Chain(World):
    """A first-order chain whose states are its tokens (ids ``offset`` onward): the state is the
    last token, so exact transitions are the chain's own."""

    def __init__(self, name: str, tokenizer, step: Transition, offset: int, length: int) -> None:
        emit = torch.arange(step.size) + offset
        super().__init__(name, tokenizer, emit, stationary(step), [step], length)
        self.offset = offset

    def transition_reference(self, length: int | None = None) -> ChainReference:
        """q(b | a) on token ids: the chain's own transition (stationary start: the same at every
        position), as sparse as the chain."""
        return ChainReference(self.steps[0], self.offset, self.vocab_size)

    @torch.no_grad()
    def log_prob(self, tokens: Tensor) -> Tensor:
        """(B,) exact log p(tokens) in nats, float64, from the chain's own factors (the forward
        pass would hold a (B, L, V) float64 evidence table: 2 GB for 256 sequences of 128 of the
        8,192-token chain); -inf for a sequence the world never makes."""
        ref = self.transition_reference()
        tokens = tokens.cpu().long()
        state, inside = ref.state_of(tokens[:, 0])
        first = torch.zeros(len(tokens), dtype=torch.float64)
        first[inside] = self.initial[state[inside]]
        pairs = ref.prob(tokens[:, :-1], tokens[:, 1:])
        return first.log() + pairs.log().sum(-1)


class CharChain(Chain):
    """The character chain: 27 symbols (space, a-z) of a corpus (default: the bundled Austen
    novels), about 3.3 bits per character.

    Args:
        path: the corpus (``cdlm.data.corpus.load_documents``); None: bundled Austen.
        length: sequence length (Tang et al. use 128 and 1024).
        smoothing, top_k, teleport, temperature: the construction (``fit_transition``).
    """

    def __init__(
        self,
        path: str | None = None,
        length: int = 128,
        smoothing: float = 1e-4,
        top_k: int | None = None,
        teleport: float = 0.0,
        temperature: float = 1.0,
    ) -> None:
        text = letters(" ".join(d.text for d in load_documents(path)))
        index = {c: i for i, c in enumerate(ALPHABET)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        step = fit_transition(
            pair_counts(ids, len(ALPHABET)), smoothing, top_k, teleport, temperature
        )
        super().__init__("chars", symbol_tokenizer(list(ALPHABET)), step, 3, length)


class TokenChain(Chain):
    """The token chain: a first-order chain over a tokenizer's tokens (default: the bundled
    Austen corpus under its own byte-level BPE of ``vocab_size``), sparse by default.

    Args:
        path: the corpus; None: bundled Austen.
        vocab_size: the corpus BPE's size (the tokenizer cdlm-train builds for ``data=austen``).
        length, smoothing, top_k, teleport, temperature: as for ``CharChain``; the special
            tokens are never emitted.
    """

    def __init__(
        self,
        path: str | None = None,
        vocab_size: int = 8192,
        length: int = 128,
        smoothing: float = 1e-4,
        top_k: int | None = 64,
        teleport: float = 1e-3,
        temperature: float = 1.0,
    ) -> None:
        docs = load_documents(path)
        tokenizer = corpus_bpe(docs, vocab_size)
        offset = len(SPECIAL_TOKENS)
        specials = {tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS.values()}
        if specials != set(range(offset)):
            raise ValueError("the token chain needs the tokenizer's special tokens at ids 0-2")
        eos = tokenizer.eos_token_id
        streams = [torch.tensor(tokenizer(d.text.replace("\n", " "))["input_ids"]) for d in docs]
        ids = torch.cat([s[s != eos] for s in streams]) - offset
        size = len(tokenizer) - offset
        step = fit_transition(pair_counts(ids, size), smoothing, top_k, teleport, temperature)
        super().__init__("tokens", tokenizer, step, offset, length)
