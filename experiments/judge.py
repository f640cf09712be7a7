"""The label judge of ``guidance_sweep.py``: which label (novel, domain) does a passage come
from? Trained on real text only (never on generated samples), so that "label accuracy" of
guided samples is measured against a fixed yardstick: multinomial naive Bayes over lowercase
word counts (McCallum & Nigam 1998, "A comparison of event models for naive Bayes text
classification"), with a uniform class prior by default so that it does not favour the longest
text."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from cdlm.data.corpus import load_documents

WORD = re.compile(r"[a-z']+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


class LabelJudge:
    """Multinomial naive Bayes: log p(c | x) = log p(c) + sum_w n_w(x) log p(w | c) + const.

    Args:
        alpha: Laplace (add-alpha) smoothing of the per-class word counts.
        min_count: words seen fewer times than this in all training text are dropped.
        uniform_prior: True gives every class prior 1/C; False uses the training-text frequency.
    """

    def __init__(self, alpha: float = 1.0, min_count: int = 1, uniform_prior: bool = True) -> None:
        self.alpha, self.min_count, self.uniform_prior = alpha, min_count, uniform_prior
        self.vocab: dict[str, int] = {}
        self.log_prior = np.zeros(0)
        self.log_likelihood = np.zeros((0, 0))  # (C, V) log p(w | c)
        self._labels: list[str] = []

    @property
    def labels(self) -> list[str]:
        return self._labels

    def fit(self, texts: list[str], labels: list[str]) -> LabelJudge:
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"need as many labels as texts, got {len(texts)} / {len(labels)}")
        self._labels = sorted(set(labels))
        per_class = {c: Counter() for c in self._labels}
        for text, label in zip(texts, labels, strict=True):
            per_class[label].update(words(text))
        total = sum(per_class.values(), Counter())
        kept = sorted(w for w, n in total.items() if n >= self.min_count)
        self.vocab = {w: i for i, w in enumerate(kept)}
        counts = np.array([[per_class[c][w] for w in kept] for c in self._labels], dtype=np.float64)
        smoothed = counts + self.alpha
        self.log_likelihood = np.log(smoothed) - np.log(smoothed.sum(1, keepdims=True))
        n_docs = np.array([labels.count(c) for c in self._labels], dtype=np.float64)
        prior = np.ones(len(self._labels)) if self.uniform_prior else n_docs
        self.log_prior = np.log(prior / prior.sum())
        return self

    def log_posterior(self, texts: list[str]) -> np.ndarray:
        """(N, C) normalised log p(class | text); out-of-vocabulary words are ignored."""
        out = np.empty((len(texts), len(self._labels)))
        for i, text in enumerate(texts):
            idx = [self.vocab[w] for w in words(text) if w in self.vocab]
            out[i] = self.log_prior + self.log_likelihood[:, idx].sum(1)
        top = out.max(1, keepdims=True)
        return out - top - np.log(np.exp(out - top).sum(1, keepdims=True))

    def predict(self, texts: list[str]) -> list[str]:
        return [self._labels[i] for i in self.log_posterior(texts).argmax(1)]

    def accuracy(self, texts: list[str], labels: list[str]) -> float:
        hits = [p == y for p, y in zip(self.predict(texts), labels, strict=True)]
        return float(np.mean(hits)) if hits else float("nan")


@dataclass
class Chunks:
    """Word windows of a corpus, split as train (start of each document) and held out (end)."""

    train_texts: list[str]
    train_labels: list[str]
    val_texts: list[str]
    val_labels: list[str]


def corpus_chunks(
    path: str | None = None, window_words: int = 100, val_fraction: float = 0.02
) -> Chunks:
    """Cuts each document into consecutive ``window_words``-word windows (whitespace words,
    punctuation and case kept; a short tail is dropped). The split is by words: the last
    ``val_fraction`` of each document's words is held out, as the datamodule holds out the last
    fraction of each document's token sequences, so held-out text is never trained on."""
    chunks = Chunks([], [], [], [])
    for doc in load_documents(path):
        ws = doc.text.split()
        n_val = max(1, round(len(ws) * val_fraction))
        for part, texts, labels in (
            (ws[: len(ws) - n_val], chunks.train_texts, chunks.train_labels),
            (ws[len(ws) - n_val :], chunks.val_texts, chunks.val_labels),
        ):
            for k in range(0, len(part) - window_words + 1, window_words):
                texts.append(" ".join(part[k : k + window_words]))
                labels.append(doc.label)
    return chunks


def fit_on_corpus(
    path: str | None = None, window_words: int = 100, val_fraction: float = 0.02
) -> tuple[LabelJudge, float]:
    """A ``LabelJudge`` fitted on the training windows of a corpus (None: bundled Austen), and its
    accuracy on the held-out windows: the ceiling that guided samples are compared against."""
    chunks = corpus_chunks(path, window_words, val_fraction)
    judge = LabelJudge().fit(chunks.train_texts, chunks.train_labels)
    return judge, judge.accuracy(chunks.val_texts, chunks.val_labels)
