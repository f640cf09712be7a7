"""The label judge of experiments/guidance_sweep.py: naive Bayes checked by hand on a 2-word
vocabulary and on a synthetic corpus, and the held-out accuracy of the judge fitted on the
bundled Austen novels."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from judge import LabelJudge, corpus_chunks, fit_on_corpus  # noqa: E402

SEA = ["the ship sailed on the sea", "waves hit the ship", "a sailor and his boat"]
FARM = ["the cow ate grass on the farm", "a farmer milked the cow", "hay for the horse"]
CITY = ["the tram crossed the street", "a taxi in the city street", "tall towers and a tram"]


def three_class_judge(**kwargs) -> LabelJudge:
    texts = SEA + FARM + CITY
    labels = ["sea"] * 3 + ["farm"] * 3 + ["city"] * 3
    return LabelJudge(**kwargs).fit(texts, labels)


def test_predicts_synthetic_classes():
    judge = three_class_judge()
    assert judge.labels == ["city", "farm", "sea"]
    assert judge.predict(["a boat on the sea", "The COW and the farmer", "taxi, tram, street"]) == [
        "sea",
        "farm",
        "city",
    ]
    # The third label is wrong on purpose: 2 of 3 right.
    assert judge.accuracy(["waves", "grass", "towers"], ["sea", "farm", "sea"]) == pytest.approx(
        2 / 3
    )
    # No known word: the uniform prior alone, so every class is equally likely.
    assert np.allclose(judge.log_posterior(["zebra"]), math.log(1 / 3))


def test_log_posterior_by_hand():
    # Class x: counts a=2, b=1 over two texts; class y: b=1 over one text. With alpha=1,
    # p(a|x)=3/5, p(b|x)=2/5, p(a|y)=1/3, p(b|y)=2/3.
    texts, labels = ["a a", "b", "b"], ["x", "x", "y"]
    uniform = LabelJudge(alpha=1.0).fit(texts, labels)
    like_x, like_y = 3 / 5 * 2 / 5, 1 / 3 * 2 / 3
    post = uniform.log_posterior(["a b"])
    assert post.shape == (1, 2)
    assert np.exp(post[0]) == pytest.approx(
        [like_x / (like_x + like_y), like_y / (like_x + like_y)]
    )
    # Empirical prior: 2 of 3 training texts are x.
    empirical = LabelJudge(alpha=1.0, uniform_prior=False).fit(texts, labels)
    px, py = 2 / 3 * like_x, 1 / 3 * like_y
    assert np.exp(empirical.log_posterior(["a b"])[0]) == pytest.approx(
        [px / (px + py), 1 - px / (px + py)]
    )


def test_min_count_cuts_vocabulary():
    assert "sailor" in three_class_judge().vocab
    cut = three_class_judge(min_count=2)
    assert "sailor" not in cut.vocab and {"the", "ship", "cow", "tram"} <= set(cut.vocab)


def test_bundled_corpus_judge_beats_chance():
    judge, acc = fit_on_corpus(window_words=100)
    assert len(judge.labels) == 6
    assert acc > 0.85  # measured 0.94 on 140 held-out windows; chance is 1/6
    assert fit_on_corpus(window_words=100)[1] == acc
    chunks = corpus_chunks(window_words=100)
    assert not set(chunks.val_texts) & set(chunks.train_texts)
    assert all(len(t.split()) == 100 for t in chunks.val_texts)
