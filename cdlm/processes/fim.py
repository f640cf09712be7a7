"""Fill-in-the-middle for the autoregressive baseline (Bavarian et al. 2022, "Efficient Training of
Language Models to Fill in the Middle"): a share of training sequences is cut into prefix,
middle and suffix and reordered so that the middle comes last, behind sentinel tokens. A causal
model trained so infills by reading both sides as its left context, which is the fair AR
opponent for a diffusion model's infilling.

Two orders, both ending with the middle and its end sentinel:
- PSM: ``<fim_prefix> p <fim_suffix> s <fim_middle> m <fim_end>``;
- SPM (the paper's variant with the prefix joined to the middle, so that text across the
  prefix-middle boundary is tokenised as in plain documents): ``<fim_prefix> <fim_suffix> s
  <fim_middle> p m <fim_end>``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_end>")
SENTINELS = len(TOKENS)  # a formatted sequence is this much longer than its document


@dataclass(frozen=True)
class FimIds:
    """The sentinels' token ids."""

    prefix: int
    suffix: int
    middle: int
    end: int

    @classmethod
    def of(cls, ids: list[int] | tuple[int, ...]) -> FimIds:
        if len(ids) != SENTINELS or len(set(ids)) != SENTINELS:
            raise ValueError(f"fim_ids needs {SENTINELS} distinct ids ({', '.join(TOKENS)})")
        return cls(*(int(i) for i in ids))

    def as_list(self) -> list[int]:
        return [self.prefix, self.suffix, self.middle, self.end]


def add_tokens(tokenizer) -> list[int]:
    """Adds the sentinels to ``tokenizer`` as special tokens (once); returns their ids."""
    missing = [t for t in TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    return [tokenizer.convert_tokens_to_ids(t) for t in TOKENS]


def prompt(prefix: Tensor, suffix: Tensor, ids: FimIds, mode: str = "psm") -> Tensor:
    """The inference prompt (..., P) after which the model writes the middle, for prefix and
    suffix rows (..., a) and (..., c): PSM's or SPM's sequence up to and including the middle
    token (in SPM also the prefix, which the middle continues)."""
    lead = prefix.shape[:-1]

    def sentinel(i: int) -> Tensor:
        return torch.full((*lead, 1), i, dtype=prefix.dtype, device=prefix.device)

    if mode == "psm":
        parts = [sentinel(ids.prefix), prefix, sentinel(ids.suffix), suffix, sentinel(ids.middle)]
    elif mode == "spm":
        parts = [sentinel(ids.prefix), sentinel(ids.suffix), suffix, sentinel(ids.middle), prefix]
    else:
        raise ValueError(f"fim mode must be 'psm' or 'spm', got {mode!r}")
    return torch.cat(parts, dim=-1)


def format_document(doc: Tensor, cuts: tuple[int, int], ids: FimIds, mode: str) -> Tensor:
    """One document (n,) cut at ``cuts`` = (a, b), 0 <= a <= b <= n, as a training sequence of
    n + 4 tokens: the prompt, the middle ``doc[a:b]`` and the end sentinel."""
    a, b = cuts
    if not 0 <= a <= b <= doc.shape[0]:
        raise ValueError(f"cuts {cuts} do not lie in a document of {doc.shape[0]} tokens")
    end = torch.tensor([ids.end], dtype=doc.dtype, device=doc.device)
    return torch.cat([prompt(doc[:a], doc[b:], ids, mode), doc[a:b], end])


def parse(seq: Tensor, ids: FimIds) -> tuple[Tensor, Tensor, Tensor]:
    """(prefix, suffix, middle) of a PSM sequence: the inverse of ``format_document`` (an SPM
    one does not mark where its prefix ends and its middle starts)."""
    s = seq.tolist()
    if s[0] != ids.prefix or s[-1] != ids.end:
        raise ValueError("not a FIM sequence: it must start with <fim_prefix>, end with <fim_end>")
    suf, mid = s.index(ids.suffix), s.index(ids.middle)
    return seq[1:suf], seq[suf + 1 : mid], seq[mid + 1 : -1]


def transform(
    tokens: Tensor,
    valid: Tensor,
    rate: float,
    spm_rate: float,
    ids: FimIds,
    filler: int,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """A training batch with a ``rate`` share of its rows FIM-formatted (``spm_rate`` of those
    in SPM), as (tokens, valid), both (B, L). A formatted row is its first valid ``L - 4``
    tokens cut at two uniform points; its remaining positions hold ``filler`` and do not count."""
    batch, length = tokens.shape
    if length <= SENTINELS:
        raise ValueError(f"FIM needs sequences longer than {SENTINELS} tokens, got {length}")
    draws = torch.rand(batch, 4, generator=generator)  # on the CPU, as is ``generator``
    tokens, valid = tokens.clone(), valid.clone()
    for row in torch.nonzero(draws[:, 0] < rate).flatten().tolist():
        n = min(int(valid[row].sum()), length - SENTINELS)
        doc = tokens[row, valid[row]][:n]
        a, b = sorted((int(draws[row, 1] * (n + 1)), int(draws[row, 2] * (n + 1))))
        mode = "spm" if draws[row, 3] < spm_rate else "psm"
        seq = format_document(doc, (min(a, n), min(b, n)), ids, mode)
        tokens[row] = filler
        tokens[row, : seq.shape[0]] = seq
        valid[row] = False
        valid[row, : seq.shape[0]] = True
    return tokens, valid
