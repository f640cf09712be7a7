"""The task suite: passages on word boundaries, each task's acceptance check on hand-built
passing and failing cases, corruptions that keep the canvas, an oracle that scores 100% on
infill and correct without touching a correct word, and ``cdlm-eval task=...`` end to end."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn

from cdlm.data.corpus import load_documents
from cdlm.data.tokenizer import corpus_bpe
from cdlm.generation.choice import named_sampler
from cdlm.model_file import Model
from cdlm.processes import MaskedProcess
from cdlm.tasks import correct, infill
from cdlm.tasks.passages import held_out, lay_out
from tests.conftest import run_main

L = 48


@pytest.fixture(scope="module")
def tok(tiny_corpus):
    return corpus_bpe(load_documents(str(tiny_corpus)), vocab_size=300)


class KnowsPassages(nn.Module):
    """A masked model's network that recognises its passage (the one that agrees with the
    visible tokens most) and predicts its true tokens everywhere."""

    def __init__(self, passages, vocab: int, sure: float = 30.0) -> None:
        super().__init__()
        self.truth = [torch.tensor(p.ids) for p in passages]
        self.vocab, self.anchor, self.sure = vocab, nn.Parameter(torch.zeros(())), sure

    def forward(self, z, t, self_cond=None, **kw):
        logits = torch.zeros(*z.shape, self.vocab)
        for row, seq in enumerate(z):
            fits = [p for p in self.truth if len(p) == len(seq)]
            best = max(fits, key=lambda p: int((p == seq).sum()))
            logits[row, torch.arange(len(seq)), best] = self.sure
        return logits


@pytest.fixture(scope="module")
def oracle(tok, tiny_corpus):
    process = MaskedProcess(len(tok), mask_id=tok.mask_token_id, eos_id=tok.eos_token_id).eval()
    bare = Model(process, nn.Identity(), tok, {"seq_len": L})
    passages = held_out(bare, 6, L - 4, seed=3, data_path=str(tiny_corpus))
    return Model(process, KnowsPassages(passages, len(tok)).eval(), tok, {"seq_len": L}), passages


def test_passages_are_whole_words_laid_out_word_by_word(oracle, tok):
    _, passages = oracle
    assert len(passages) == 6 and len({p.text for p in passages}) == 6
    for p in passages:
        assert 0 < len(p.ids) <= L - 4
        assert p.spans[0][0] == 0 and p.spans[-1][1] == len(p.ids)
        assert all(a < b for a, b in p.spans)
        assert all(p.spans[i][1] == p.spans[i + 1][0] for i in range(len(p.spans) - 1))
        assert lay_out(tok, p.words) == p


def test_infill_check_accepts_only_the_span_recovered_and_flags_a_moved_fixed_token(oracle):
    _, passages = oracle
    case = infill.Case(passages[0], 4, 3)
    truth = list(passages[0].ids)
    assert infill.check(case, truth) == infill.Check(3, True, True)
    wrong = truth[:5] + [truth[5] + 1] + truth[6:]
    assert infill.check(case, wrong) == infill.Check(2, False, True)
    moved = [truth[0] + 1] + truth[1:]
    assert infill.check(case, moved) == infill.Check(3, True, False)
    cases = infill.make_cases(passages, 4, seed=0)
    assert all(infill.MARGIN <= c.start <= len(c.passage.ids) - 4 - infill.MARGIN for c in cases)
    assert cases == infill.make_cases(passages, 4, seed=0)


def test_corruptions_keep_every_word_on_the_canvas_and_the_check_counts_words(oracle, tok):
    _, passages = oracle
    pool = sorted({w.strip() for p in passages for w in p.words if w.strip().isalpha()})
    rng = random.Random(0)
    for p in passages:
        case = correct.corrupt(tok, p, 0.15, pool, rng)
        assert len(case.corrupted.ids) == len(p.ids)
        assert case.corrupted.spans[-1][1] == len(p.ids)
        assert len(case.wrong) in (round(0.15 * len(p.words)), round(0.15 * len(p.words)) - 1)
        for w in case.wrong:  # each corrupted word reads differently, on the same tokens
            assert case.corrupted.words[w] != p.words[w]
        assert [w for w in range(len(p.words)) if case.corrupted.words[w] != p.words[w]] == sorted(
            case.wrong
        )
        ids = list(p.ids)
        check = correct.check(case, ids)
        assert check.accepted and check.restored == len(case.wrong) and check.changed == 0
        check = correct.check(case, list(case.corrupted.ids))
        assert not check.accepted or not case.wrong
        a, b = p.spans[next(w for w in range(len(p.words)) if w not in case.wrong)]
        ids[a] += 1  # a correct word changed: not accepted even with every fix made
        assert not correct.check(case, ids).accepted and correct.check(case, ids).changed == 1


def test_an_oracle_infills_and_corrects_everything_and_changes_no_correct_word(oracle):
    model, passages = oracle
    sampler = named_sampler("confidence")
    rows = infill.run(model, sampler, passages, steps=4, seed=0, scorer=None, spans=[1, 4, 16])
    assert [r["span"] for r in rows] == [1, 4, 16]
    for r in rows:
        assert r["token_accuracy"] == r["span_exact"] == r["fixed_intact"] == 1.0
        assert r["nfe"] >= 1 and r["positions"] >= r["nfe"] and r["wall_s_median"] > 0
    rows = correct.run(model, sampler, passages, steps=4, seed=0, rates=[0.05, 0.15], suspects=0.3)
    for r in rows:
        assert r["corrupted_words"] > 0
        assert r["restored"] == 1.0 and r["changed_correct"] == 0.0 and r["acceptance"] == 1.0
        assert r["revision_rounds"] == 1  # one round fixes all; the second finds nothing


def test_a_refill_stays_only_where_it_beats_the_user_word_by_the_margin(oracle, tok):
    """A model that prefers the original only by 1 nat per token: below the 2-nat margin its
    refills are undone (nothing changes, nothing is restored); with no margin they stay. The
    corrupted words are the passage's lowest-scoring, so a share of suspects above the rate
    takes them all."""
    model, passages = oracle
    doubtful = Model(
        model.process, KnowsPassages(passages, len(tok), sure=1.0).eval(), tok, model.config
    )
    sampler = named_sampler("confidence")
    options = {"steps": 4, "seed": 0, "rates": [0.15], "suspects": 0.3}
    (kept,) = correct.run(doubtful, sampler, passages, margin=2.0, **options)
    assert kept["restored"] == 0.0 and kept["changed_correct"] == 0.0
    (free,) = correct.run(doubtful, sampler, passages, margin=0.0, **options)
    assert free["restored"] > 0.5


def records(path):
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    "ckpt, task, options",
    [
        ("tiny_masked_checkpoint", "infill", ["task.spans=[1,4]"]),
        ("tiny_fim_checkpoint", "infill", ["task.spans=[1,4]"]),
        ("tiny_fim_checkpoint", "correct", ["task.rates=[0.15]"]),
        ("tiny_masked_checkpoint", "correct", ["task.rates=[0.15]", "task.rounds=1"]),
        ("tiny_checkpoint", "correct", ["task.rates=[0.15]", "task.rounds=1"]),
        ("tiny_checkpoint", "write", ["task.samples=2"]),
    ],
)
def test_cdlm_eval_task_writes_its_rows(ckpt, task, options, request, tmp_path):
    out = tmp_path / "task.json"
    result = run_main(
        "cdlm-eval",
        f"ckpt={request.getfixturevalue(ckpt)}",
        f"task={task}",
        *options,
        "cases=3",
        "steps=2",
        "scorer=none",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = records(out)
    assert report["task"] == task and report["tokenizer"]["vocab"] > 0
    for row in report["rows"]:
        assert {"task", "process", "sampler", "nfe", "positions", "wall_s_median"} <= set(row)
        figures = {"infill": ("span", "token_accuracy", "span_exact"), "write": ("entropy",)}
        figures["correct"] = ("rate", "restored", "changed_correct", "acceptance")
        assert set(figures[task]) <= set(row)
    if "fim" in ckpt:
        assert report["process"] == "autoregressive+fim"
    if task == "correct":  # progress on stderr: a user sees the cases go by
        assert "cdlm-eval: correct at rate 0.15, case 3/3, done" in result.stderr


def test_task_errors_name_the_problem(tiny_ar_checkpoint, tiny_checkpoint, tmp_path):
    for ckpt, task, needle in (
        (tiny_ar_checkpoint, "infill", "fim_rate"),
        (tiny_ar_checkpoint, "correct", "fim_rate"),
    ):
        result = run_main(
            "cdlm-eval",
            f"ckpt={ckpt}",
            f"task={task}",
            "cases=2",
            "steps=2",
            "scorer=none",
            f"out={tmp_path / 'x.json'}",
            cwd=tmp_path,
        )
        assert result.returncode != 0 and needle in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("kind", ["masked_shift", "block"])
def test_correct_scores_and_refills_with_untrained_masked_family_models(kind, tok, oracle):
    """Shifted masked and block models score words through their own prediction (block: with
    its clean stream) and refill them; the figures are shares, and fixed words stay fixed."""
    from cdlm.networks.transformer import Transformer
    from cdlm.processes import BlockProcess

    _, passages = oracle
    v, mask, eos = len(tok), tok.mask_token_id, tok.eos_token_id
    process = (
        MaskedProcess(v, mask_id=mask, eos_id=eos, shift=True)
        if kind == "masked_shift"
        else BlockProcess(v, mask_id=mask, block_size=4, eos_id=eos)
    ).eval()
    torch.manual_seed(0)
    net = Transformer(
        **process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=L + 1
    )
    model = Model(process, net.eval(), tok, {"seq_len": L})
    sampler = named_sampler("block" if kind == "block" else "confidence", stop_at_eos=False)
    scores = correct.word_scores(model, passages[0].ids, passages[0].spans)
    assert scores.shape == (len(passages[0].spans),) and (scores <= 0).all()
    (row,) = correct.run(model, sampler, passages[:2], steps=4, seed=0, rates=[0.15], rounds=1)
    assert 0 <= row["restored"] <= 1 and 0 <= row["changed_correct"] <= 1
    assert row["nfe"] >= sum(len(p.spans) for p in passages[:1])
