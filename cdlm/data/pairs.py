"""Prompt→response rows (``data.format=pairs``): a JSONL file of pairs, one row each.

Each line is an object with ``prompt`` and ``response`` strings, or ``messages`` (a chat list
whose last message is the response), rendered with the tokenizer's chat template. A row is the
prompt's ids, the response's ids, one EOS, then PAD to ``seq_len``. The response's own EOS is part
of the response, so the model learns to stop (LLaDA's SFT); the PAD after it is never scored
(``valid`` False), so padding cannot flood the loss with EOS targets (dllm issue #81). A row too
long loses the start of its prompt (its end, next to the response, is what the response follows
on); a response that leaves no room for one prompt token is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset


@dataclass
class Pair:
    """One example: its prompt and response texts, and its line in the file (for errors)."""

    prompt: str
    response: str
    line: int


def read_pairs(path: str | None, tokenizer=None) -> list[Pair]:
    """The pairs of the JSONL file ``path``; ``messages`` chats are rendered with ``tokenizer``'s
    chat template, so they need one. A bad line is a ValueError naming it."""
    file = Path(str(path)).expanduser()
    if path is None or not file.is_file():
        raise ValueError(f"data.format=pairs needs data.path to be a JSONL file, got {path!r}")
    pairs = []
    for number, text in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if text.strip():
            pairs.append(_pair(text, tokenizer, number, f"data.path={path} line {number}"))
    if not pairs:
        raise ValueError(f"data.path={path} holds no prompt→response pairs")
    return pairs


def _pair(text: str, tokenizer, number: int, where: str) -> Pair:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg})") from None
    if isinstance(record, dict) and "messages" in record:
        return _chat(record["messages"], tokenizer, number, where)
    fields = [record.get(k) for k in ("prompt", "response")] if isinstance(record, dict) else []
    if len(fields) != 2 or not all(isinstance(f, str) for f in fields):
        raise ValueError(f'{where}: needs "prompt" and "response" strings, or "messages"')
    if not fields[0]:
        raise ValueError(f"{where}: the prompt is empty")
    return Pair(fields[0], fields[1], number)


def _chat(messages, tokenizer, number: int, where: str) -> Pair:
    """The chat up to its last message, rendered with the generation prompt, as the prompt; the
    last message's content as the response."""
    if tokenizer is None or tokenizer.chat_template is None:
        raise ValueError(
            f'{where}: "messages" needs a tokenizer with a chat template (data.tokenizer=...); '
            "this one has none"
        )
    ok = isinstance(messages, list) and len(messages) >= 2
    ok = ok and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
    if not ok or messages[-1].get("role") != "assistant":
        raise ValueError(f"{where}: messages must be a chat list that ends with the assistant's")
    prompt = tokenizer.apply_chat_template(
        messages[:-1], tokenize=False, add_generation_prompt=True
    )
    return Pair(prompt, messages[-1]["content"], number)


@dataclass
class PairRows:
    """tokens (N, L) ids; valid (N, L): False on PAD only; prompt (N, L): the prompt positions."""

    tokens: Tensor
    valid: Tensor
    prompt: Tensor


def encode_pairs(tokenizer, pairs: list[Pair], seq_len: int) -> PairRows:
    """One row of ``seq_len`` per pair: prompt (its start cut if need be), response, EOS, PAD."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = tokenizer([p.prompt for p in pairs], add_special_tokens=False)["input_ids"]
    responses = tokenizer([p.response for p in pairs], add_special_tokens=False)["input_ids"]
    tokens, valid, prompt = [], [], []
    for pair, ask, answer in zip(pairs, prompts, responses, strict=True):
        answer = [*answer, eos]
        room = seq_len - len(answer)
        if room < 1 or not ask:
            raise ValueError(
                f"data.path line {pair.line}: "
                + (
                    f"the response ({len(answer)} tokens with its EOS) leaves no room for the "
                    f"prompt in data.seq_len={seq_len}; raise data.seq_len"
                    if ask
                    else "the prompt has no tokens"
                )
            )
        ask = ask[-room:]
        used = len(ask) + len(answer)
        tokens.append(ask + answer + [pad] * (seq_len - used))
        valid.append([True] * used + [False] * (seq_len - used))
        prompt.append([True] * len(ask) + [False] * (seq_len - len(ask)))
    return PairRows(
        torch.tensor(tokens, dtype=torch.long), torch.tensor(valid), torch.tensor(prompt)
    )


class PairDataset(Dataset):
    """The rows of ``PairRows``; every item has label 0 (pairs carry no class labels)."""

    def __init__(self, rows: PairRows) -> None:
        self.tokens, self.valid, self.prompt = rows.tokens, rows.valid, rows.prompt

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {
            "tokens": self.tokens[i],
            "label": torch.zeros((), dtype=torch.long),
            "valid": self.valid[i],
            "prompt": self.prompt[i],
        }

    def counted_tokens(self) -> Tensor:
        """The ids that are text, not PAD (the unigram prior's counts)."""
        return self.tokens[self.valid]
