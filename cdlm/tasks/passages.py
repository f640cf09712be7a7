"""Held-out passages cut on word boundaries: the inputs of the text tasks.

A passage is laid out word by word: each word keeps the whitespace before it and is tokenised
on its own, so every word owns a token span. A task can then blank or corrupt whole words and
score them by their spans, whatever the tokenizer merges across them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import Model
from cdlm.worlds.base import World
from cdlm.worlds.data import draw

WORD = re.compile(r"\s*\S+")


@dataclass(frozen=True)
class Passage:
    ids: list[int]  # the canvas, word after word
    spans: list[tuple[int, int]]  # each word's token span [a, b)
    words: list[str]  # each word with the whitespace before it
    world: str | None = None  # world:<name> when the passage is an exact sample of that world

    @property
    def text(self) -> str:
        return "".join(self.words)


def word_ids(tokenizer, word: str) -> list[int]:
    """``word``'s tokens, each line break as EOS: the line break every model here trained on
    (a corpus's lines end in EOS), never the tokenizer's unseen newline byte."""
    lines = word.split("\n")
    ids = list(tokenizer(lines[0], add_special_tokens=False)["input_ids"]) if lines[0] else []
    for line in lines[1:]:
        ids.append(tokenizer.eos_token_id)
        ids += tokenizer(line, add_special_tokens=False)["input_ids"] if line else []
    return ids


def lay_out(tokenizer, words: list[str]) -> Passage:
    """The passage of ``words`` (each with its leading whitespace)."""
    ids, spans = [], []
    for word in words:
        piece = word_ids(tokenizer, word)
        spans.append((len(ids), len(ids) + len(piece)))
        ids += piece
    return Passage(ids, spans, list(words))


def held_out(
    model: Model,
    count: int,
    length: int,
    seed: int,
    data_path: str | None = None,
    val_fraction: float = 0.02,
) -> list[Passage]:
    """``count`` passages of at most ``length`` tokens from distinct validation sequences, chosen
    by ``seed``: each sequence's text (paragraph breaks as line breaks) without its first and
    last words, which its window may have cut, and as many whole words as fit."""
    tokens = validation_tokens(model, data_path, val_fraction)
    order = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(seed)).tolist()
    tok, found = model.tokenizer, []
    for row in order[:count]:
        ids = [t for t in tokens[row].tolist() if t != tok.pad_token_id]
        text = decode_lines(tok, ids)
        words, size = [], 0
        for word in WORD.findall(text)[1:-1]:
            size += len(word_ids(tok, word))
            if size > length:
                break
            words.append(word)
        found.append(lay_out(tok, words))
    if len(found) < count:
        raise ValueError(f"the validation split holds {len(found)} sequences; {count} asked for")
    return found


def world_passages(world: World, spec: str, count: int, length: int, seed: int) -> list[Passage]:
    """``count`` exact samples of ``world`` of ``length`` tokens, drawn from a stream of their
    own keyed by ``seed`` (never a training or validation stream, ``cdlm.worlds.data.draw``),
    each token a word: a world's text has no word boundaries a tokenizer did not make."""
    found = []
    for row in draw(world, count, length, "task-passages", seed).tolist():
        words = [world.tokenizer.decode([t]) for t in row]
        found.append(Passage(row, [(i, i + 1) for i in range(len(row))], words, spec))
    return found


def decode_lines(tokenizer, ids: list[int]) -> str:
    """``ids`` decoded with each EOS as a line break (the line break of every corpus here)."""
    return "\n".join(tokenizer.decode(p) for p in _split(ids, tokenizer.eos_token_id))


def _split(ids: list[int], eos: int) -> list[list[int]]:
    pieces, current = [], []
    for t in ids:
        if t == eos:
            pieces.append(current)
            current = []
        else:
            current.append(t)
    return [*pieces, current]
