"""experiments/lmeval_local.py's pure parts: the cloze rows and the table's statistics, on
hand-made sentences and log-likelihoods."""

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
lmeval_local = importlib.import_module("lmeval_local")
sys.path.pop(0)

SENTENCES = {
    "a": [
        "She had always been a great deal too fond of her own cat.",
        "Nobody who had ever seen him would have thought it at all possible.",
        '"A quoted sentence that is long enough to count, but is quoted."',
        "He walked the whole length of the avenue without any umbrella.",
    ],
    "b": [
        "It was a morning of no great promise for anybody in the house.",
        "Short one.",
        "They spoke of nothing but the weather and the roads till dinner.",
    ],
}


def test_rows_alternate_novels_rotate_the_answer_and_skip_what_does_not_qualify():
    corpus = "\n".join(s for pool in SENTENCES.values() for s in pool)
    rows = lmeval_local.cloze_rows(SENTENCES, corpus, 5)
    contexts = [r["context"] for r in rows]
    assert contexts == [
        "She had always been a great deal too fond of her own",
        "It was a morning of no great promise for anybody in the",
        "Nobody who had ever seen him would have thought it at all",
        "They spoke of nothing but the weather and the roads till",
        "He walked the whole length of the avenue without any",
    ]
    answers = ["cat", "house", "possible", "dinner", "umbrella"]
    assert [r["label"] for r in rows] == [0, 1, 2, 3, 0]
    for i, row in enumerate(rows):
        assert row["choices"][row["label"]] == answers[i]
        others = [answers[(i + k) % 5] for k in (1, 2, 3)]
        assert [c for c in row["choices"] if c != answers[i]] == others


def test_a_sentence_found_twice_in_the_corpus_is_left_out_and_too_few_rows_refused():
    corpus = "\n".join(s for pool in SENTENCES.values() for s in pool) + "\n" + SENTENCES["a"][0]
    rows = lmeval_local.cloze_rows(SENTENCES, corpus, 4)
    assert all(not r["context"].startswith("She had") for r in rows)
    with pytest.raises(ValueError, match="only 4 held-out rows qualify, 5 asked for"):
        lmeval_local.cloze_rows(SENTENCES, corpus, 5)


def test_the_table_averages_accuracy_and_the_per_row_std_over_seeds():
    rows = [{"label": 0}, {"label": 1}]
    lls = [  # seed -> row -> the four choices' log-likelihoods
        [[-1.0, -2.0, -3.0, -4.0], [-1.0, -5.0, -3.0, -4.0]],
        [[-3.0, -2.0, -3.0, -4.0], [-1.0, -2.0, -3.0, -4.0]],
        [[-2.0, -2.0, -3.0, -4.0], [-1.0, -8.0, -3.0, -4.0]],
    ]
    units = [
        {
            "model": "masked",
            "process": "masked",
            "mc_draws": 4,
            "seed": s,
            "acc": a,
            "acc_stderr": 0.5,
            "loglikelihoods": ll,
            "wall_seconds": 1.0,
        }
        for s, (a, ll) in enumerate(zip((0.5, 0.0, 0.5), lls, strict=True))
    ]
    (row,) = lmeval_local.summarise(units, rows)
    assert row["acc"] == pytest.approx(1 / 3)
    # gold std: row 0 over (-1, -3, -2) is 1; row 1 over (-5, -2, -8) is 3
    assert row["std_gold"] == pytest.approx(2.0)
    assert row["std_all_choices"] == pytest.approx((1 + 3) / 8)


def test_accuracy_standard_error_is_lm_evals():
    got = lmeval_local.accuracy([True, False, False, True])
    assert got == {"acc": 0.5, "acc_stderr": pytest.approx((0.25 / 3) ** 0.5)}
