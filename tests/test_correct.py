"""task=correct's repair (issue 42): a refill judged against the user's word in the same
canvas, suspects ranked within the passage, word scores batched with the same answers as one
row per call, and the work counted per scored row."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cdlm.data.corpus import load_documents
from cdlm.data.tokenizer import corpus_bpe
from cdlm.generation.choice import named_sampler
from cdlm.model_file import Model
from cdlm.networks.transformer import Transformer
from cdlm.processes import MaskedProcess
from cdlm.tasks import correct
from cdlm.tasks.passages import held_out

L = 48


@pytest.fixture(scope="module")
def passages(tiny_corpus):
    tok = corpus_bpe(load_documents(str(tiny_corpus)), vocab_size=300)
    process = MaskedProcess(len(tok), mask_id=tok.mask_token_id, eos_id=tok.eos_token_id).eval()
    bare = Model(process, nn.Identity(), tok, {"seq_len": L})
    return bare, held_out(bare, 3, L - 4, seed=3, data_path=str(tiny_corpus))


class Partners(nn.Module):
    """Knows the passage, except that it wants the one-token words at ``i`` and ``j`` equal:
    each predicts the other's token where that one is visible, and ``q`` where it is masked.
    Every other position predicts its true token; ``calls`` counts network evaluations."""

    def __init__(self, truth: list[int], i: int, j: int, q: int, mask: int, vocab: int) -> None:
        super().__init__()
        self.truth, self.i, self.j, self.q, self.mask = torch.tensor(truth), i, j, q, mask
        self.vocab, self.calls, self.anchor = vocab, 0, nn.Parameter(torch.zeros(()))

    def forward(self, z, t, self_cond=None, **kw):
        self.calls += 1
        target = self.truth.expand(z.shape[0], -1).clone()
        for a, b in ((self.i, self.j), (self.j, self.i)):
            target[:, a] = torch.where(z[:, b] == self.mask, self.q, z[:, b])
        return torch.zeros(*z.shape, self.vocab).scatter_(-1, target[..., None], 30.0)


@pytest.fixture
def partners(passages):
    """A clean passage (nothing corrupted) and a Partners model over two of its one-token words
    of different tokens."""
    bare, found = passages
    p = found[0]
    single = [w for w, (a, b) in enumerate(p.spans) if b - a == 1]
    w1 = single[0]
    w2 = next(w for w in single if p.ids[p.spans[w][0]] != p.ids[p.spans[w1][0]])
    i, j = p.spans[w1][0], p.spans[w2][0]
    q = next(t for t in range(5, 300) if t not in (p.ids[i], p.ids[j]))
    tok = bare.tokenizer
    net = Partners(p.ids, i, j, q, tok.mask_token_id, len(tok)).eval()
    case = correct.Case(p, p, frozenset())
    return Model(bare.process, net, tok, {"seq_len": L}), case, (w1, w2), q


def test_a_joint_refill_vouching_for_itself_changed_correct_words_and_now_does_not(partners):
    """Both partner words score ~ -30 with the other visible, so both are refilled, jointly,
    with q, q. The old judgement scored each q in the refilled canvas (its partner q too:
    ~0 nats) against the user's word in the user's canvas (~ -30): a 30-nat gain, two correct
    words changed. In the same canvas (the partner as the user wrote it), q scores no better
    than the user's word, so nothing changes."""
    model, case, (w1, w2), q = partners
    p, sampler = case.original, named_sampler("confidence", stop_at_eos=False)
    scores = correct.word_scores(model, p.ids, p.spans)
    assert correct.suspects_of(scores, 2 / len(p.spans)) == sorted([w1, w2])
    options = {"steps": 64, "seed": 0, "suspects": 2 / len(p.spans), "rounds": 2, "margin": 2.0}
    ids, stats = correct.repair(model, sampler, case, **options)
    assert ids == p.ids and correct.check(case, ids).changed == 0
    assert stats.revision_rounds == 0
    refilled = list(p.ids)
    for w in (w1, w2):
        refilled[p.spans[w][0]] = q
    old_gain = correct.word_scores(model, refilled, [p.spans[w1]]) - scores[w1]
    assert old_gain.item() > 20  # the old rule would have kept q, a correct word changed
    new_gain = correct.hidden_scores(
        model, [p.ids[: p.spans[w1][0]] + [q] + p.ids[p.spans[w1][1] :]], [p.spans[w1]]
    )
    assert (new_gain - scores[w1]).item() < 2.0


def test_suspects_are_the_passages_lowest_words_whatever_the_absolute_scale():
    """A weak model: every word below log(0.01), all refilled by the old absolute rule. The
    relative rule takes the share asked for, the lowest, in word order, and the same words
    after a shift of every score."""
    scores = torch.tensor([-9.0, -8.0, -12.0, -7.0, -10.0, -6.5, -8.5, -11.0, -7.5, -9.5])
    assert bool((scores < math.log(0.01)).all())
    assert correct.suspects_of(scores, 0.2) == [2, 7]
    assert correct.suspects_of(scores + 20.0, 0.2) == [2, 7]
    assert correct.suspects_of(scores, 0.01) == [2]  # at least one
    assert correct.suspects_of(scores, 5.0) == list(range(10))


def test_batched_word_scores_equal_one_row_per_call_and_call_once_per_batch(passages):
    bare, found = passages
    torch.manual_seed(0)
    process = bare.process
    net = Transformer(
        **process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=L + 1
    ).eval()
    calls = []
    net.register_forward_hook(lambda *_: calls.append(1))
    model = Model(process, net, bare.tokenizer, {"seq_len": L})
    p = found[1]
    one = correct.word_scores(model, p.ids, p.spans, batch=1)
    assert len(calls) == len(p.spans)
    calls.clear()
    many = correct.word_scores(model, p.ids, p.spans, batch=4)
    assert len(calls) == math.ceil(len(p.spans) / 4)
    torch.testing.assert_close(many, one, rtol=0, atol=1e-5)
    rows = [list(p.ids)] * len(p.spans)
    torch.testing.assert_close(correct.hidden_scores(model, rows, p.spans, batch=64), one)


def test_the_work_counts_every_scored_row_and_a_refill_sized_by_its_suspects(partners):
    """One round (nothing kept): W word rows, a 2-token refill in at most 2 steps although 64
    were allowed (the masked default sampler, ancestral, would call on until both are revealed),
    2 judged rows; each row is one evaluation of the canvas, whatever the batching."""
    model, case, _, _ = partners
    p, sampler = case.original, named_sampler("ancestral", stop_at_eos=False)
    w = len(p.spans)
    options = {"steps": 64, "seed": 0, "suspects": 2 / w, "rounds": 2, "margin": 2.0}
    model.network.calls = 0
    _, stats = correct.repair(model, sampler, case, batch=8, **options)
    refill = stats.nfe - (w + 2)
    assert 1 <= refill <= 2
    assert stats.positions == (w + 2 + refill) * len(p.ids)
    assert model.network.calls == math.ceil(w / 8) + refill + 1
