"""The context diagnostics: accuracy beside the no-context readout, per level and with the
context at its own level (``context_ceiling``)."""

import pytest
import torch

from cdlm.evaluation.context import context_ceiling, context_use
from cdlm.likelihood.evaluate import corpus_split
from cdlm.model_file import Model, load_model
from cdlm.processes import AutoregressiveProcess, MaskedProcess
from cdlm.processes.gaussian import GaussianProcess

V, L = 12, 16


class LeftNeighbour(torch.nn.Module):
    """Predicts each token as its left neighbour's readout: all context, no own evidence."""

    def __init__(self, embedding):
        super().__init__()
        self.embedding, self.dummy = embedding, torch.nn.Parameter(torch.zeros(()))

    def forward(self, x, t, self_cond=None, label=None):
        return 50.0 * self.embedding.logits(torch.roll(x, 1, dims=1))


def constant_rows():
    """Every row repeats one token, so a left neighbour always knows the answer."""
    torch.manual_seed(0)
    process = GaussianProcess(V, embed_dim=4).eval()
    model = Model(process, LeftNeighbour(process.embedding), None, {})
    tokens = torch.arange(V).repeat_interleave(3)[:, None].expand(-1, L)
    return model, tokens, torch.full((V,), -torch.log(torch.tensor(float(V))))


def test_clean_context_gives_the_answer_and_noisy_context_does_not():
    model, tokens, prior = constant_rows()
    rows = context_ceiling(model, tokens, prior, 0.9, (0.0, 0.95), stride=4, batch_size=16)
    clean, noisy = rows
    assert clean["positions"] == noisy["positions"] == tokens.numel()
    assert clean["acc"] == 1.0 and noisy["acc"] < 0.6
    # the readout sees the target only: same noise draw, same numbers whatever the context
    assert clean["base_acc"] == noisy["base_acc"] and clean["base_ce"] == noisy["base_ce"]
    assert clean["context_gain"] == pytest.approx(1.0 / clean["base_acc"])


class LeftToken(torch.nn.Module):
    """The masked counterpart: predicts each token as its left neighbour's id, if visible."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, z, t, self_cond=None, label=None):
        return 50.0 * torch.nn.functional.one_hot(torch.roll(z, 1, dims=1), V).float()


def test_masked_clean_context_gives_the_answer_and_masked_context_does_not():
    """Any process with noise levels: masked targets at 0.9 beside clean context (t = 0: nothing
    masked) are all recovered from their left neighbour; context masked at 0.95 mostly is not.
    Only masked targets are scored, and the same ones at every context level."""
    torch.manual_seed(0)
    process = MaskedProcess(V, mask_id=V - 1).eval()
    model = Model(process, LeftToken(), None, {})
    tokens = torch.arange(V - 1).repeat_interleave(3)[:, None].expand(-1, L)
    prior = torch.full((V,), -torch.log(torch.tensor(float(V - 1))))
    prior[V - 1] = -torch.inf  # [MASK] is never a token
    clean, noisy = context_ceiling(model, tokens, prior, 0.9, (0.0, 0.95), stride=4)
    assert clean["positions"] == noisy["positions"]
    assert 0.8 * tokens.numel() < clean["positions"] < tokens.numel()  # ~90% of targets masked
    assert clean["acc"] == 1.0 and noisy["acc"] < 0.3
    # a masked target has no evidence of its own: the readout is the (uniform) prior
    assert clean["base_ce"] == pytest.approx(torch.log(torch.tensor(V - 1.0)).item(), rel=1e-5)
    assert clean["base_acc"] == noisy["base_acc"] and clean["base_ce"] == noisy["base_ce"]


def test_context_ceiling_refuses_other_processes_and_bad_strides():
    ar = AutoregressiveProcess(V, bos_id=1)
    with pytest.raises(ValueError, match="needs noise levels; a 'autoregressive' model"):
        context_ceiling(Model(ar, LeftToken(), None, {}), None, None)
    model, tokens, prior = constant_rows()
    with pytest.raises(ValueError, match="stride"):
        context_ceiling(model, tokens, prior, stride=0)


def test_context_use_on_a_trained_checkpoint(tiny_checkpoint, tiny_corpus):
    model = load_model(str(tiny_checkpoint))
    data = corpus_split(model, str(tiny_corpus))
    val = data.val_set.tokens[:4]
    rows = context_use(model, val, data.log_unigram(), times=(0.05, 0.9))
    assert [r["t"] for r in rows] == [0.05, 0.9]
    for r in rows:
        assert r["positions"] == val.numel()
        assert r["context_gain"] == pytest.approx(r["acc"] / r["base_acc"])
    assert rows[0]["base_acc"] > rows[1]["base_acc"]  # the own embedding fades with noise
    ceiling = context_ceiling(model, val, data.log_unigram(), 0.9, (0.0,), stride=16)
    assert ceiling[0]["positions"] == val.numel()
