"""Exact excess during training (cdlm/evaluation/excess.py, cdlm/training/excess.py): a model's
bound beside its world's oracle on the same sequences and draws, checked against hand-computed
bounds, and logged by a world run to its CSV with the training FLOPs."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from conftest import TINY_TRAIN, train_in_process
from torch import nn

from cdlm import worlds
from cdlm.configs import compose
from cdlm.evaluation.excess import group_bits, nll_group_bits, paired_bound
from cdlm.model_file import Model, oracle_model
from cdlm.worlds.data import draw

LEN, GROUP = 8, 4


class Unigram(nn.Module):
    """A context-free network: the same logits at every position, whatever it reads."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.randn(vocab, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.logits.expand(*x.shape[:2], -1)


def process(name: str):
    return compose("train", [f"process={name}", "data=world:chars"]).process


def test_an_ar_models_excess_is_its_nll_minus_the_worlds():
    """AR: the model's bound is -log2 u(x) per token exactly (a unigram), the oracle's the world's
    exact NLL; the excess and its standard error over groups of sequences, by hand."""
    world = worlds.load("world:chars", length=LEN)
    tokens = world.sample(16, LEN, generator=torch.Generator().manual_seed(0))
    oracle = oracle_model(world, process("autoregressive"))
    unigram = Unigram(world.vocab_size)
    model = Model(oracle.process, unigram, oracle.tokenizer, oracle.config)
    options = {"seed": 0, "draws": 3, "group_size": GROUP}
    found = paired_bound(
        group_bits(model, tokens, **options), group_bits(oracle, tokens, **options)
    )
    mine = -unigram.logits.detach().double().log_softmax(-1)[tokens].mean(-1) / math.log(2)
    theirs = -world.log_prob(tokens).double() / LEN / math.log(2)
    diff = (mine - theirs).view(-1, GROUP).mean(-1)  # per group of GROUP sequences
    assert found.draws == 1 and found.groups == 4 and found.sequences == 16  # exact: one draw
    assert math.isclose(found.bound_bits, float(mine.mean()), rel_tol=1e-5)
    assert math.isclose(found.oracle_bits, float(theirs.mean()), rel_tol=1e-5)
    assert math.isclose(found.excess_bits, float(diff.mean()), rel_tol=1e-5)
    assert math.isclose(found.excess_se, float(diff.std() / 2), rel_tol=1e-4)


def test_a_masked_oracle_paired_with_itself_has_no_excess_and_unpaired_it_has():
    """The pairing: the same draws give the oracle's own bound exactly (excess 0, SE 0); other
    draws of the same bound differ by its Monte Carlo noise."""
    world = worlds.load("world:chars", length=LEN)
    tokens = world.sample(16, LEN, generator=torch.Generator().manual_seed(0))
    oracle = oracle_model(world, process("masked"))
    first = group_bits(oracle, tokens, seed=3, draws=2, group_size=GROUP)
    again = paired_bound(group_bits(oracle, tokens, seed=3, draws=2, group_size=GROUP), first)
    assert again.excess_bits == 0.0 and again.excess_se == 0.0 and again.draws == 2
    other = paired_bound(group_bits(oracle, tokens, seed=4, draws=2, group_size=GROUP), first)
    assert abs(other.excess_bits) > 1e-3 and other.excess_se > 1e-3


@pytest.mark.parametrize("name", ["autoregressive", "masked", "block", "uniform"])
def test_an_oracles_bound_is_the_worlds_nll(name):
    """The floor the excess is measured from: the oracle's bound equals the world's exact NLL
    (AR exactly; masked, block and uniform, through its leave-one-out oracle, within 3 SE over
    256 sequences and 8 draws). Gaussian is left out: its finite ends and heavy-tailed ELBO need
    far more draws."""
    world = worlds.load("world:chars", length=LEN)
    tokens = world.sample(256, LEN, generator=torch.Generator().manual_seed(5))
    oracle = oracle_model(world, process(name))
    found = paired_bound(
        group_bits(oracle, tokens, seed=0, draws=8, group_size=8),
        nll_group_bits(world, tokens, group_size=8),
    )
    assert abs(found.excess_bits) <= 3 * found.excess_se + 1e-9, (
        found.excess_bits,
        found.excess_se,
    )


def rows(path) -> list[dict]:
    with open(path / "csv" / "version_0" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_a_world_run_logs_its_excess_and_flops_to_its_csv(tmp_path, monkeypatch):
    """An AR run on world:chars: at its validation the CSV holds the excess, its SE and both
    bounds, the oracle's being the world's exact NLL of the fixed val sequences (by hand); every
    step holds its FLOPs and their running total."""
    seq, val = 16, 8
    train_in_process(
        monkeypatch,
        "data=world:chars",
        "process=autoregressive",
        *(o for o in TINY_TRAIN if not o.startswith("data.vocab_size")),
        f"data.val_size={val}",
        "callbacks.excess.group_size=2",
        "callbacks.samples.num_samples=0",
        "callbacks.model_folder.bound_sequences=0",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    )
    logged = rows(tmp_path)
    (found,) = [r for r in logged if r.get("val/excess_bits")]
    world = worlds.load("world:chars", length=seq)
    tokens = draw(worlds.load("world:chars"), val, seq, "val", "world:chars")  # the val set
    nll = float(-world.log_prob(tokens).double().mean()) / seq / math.log(2)
    assert math.isclose(float(found["val/oracle_bits"]), nll, rel_tol=1e-5)
    bound, excess = float(found["val/bound_bits"]), float(found["val/excess_bits"])
    assert math.isclose(excess, bound - nll, rel_tol=1e-4, abs_tol=1e-4)
    assert 0 < float(found["val/excess_se"]) < excess  # a random network is far off
    steps = [r for r in logged if r.get("train/flops")]
    totals = [float(r["train/flops"]) for r in steps]
    assert len(steps) == 3 and totals[0] > 0
    assert totals == [totals[0] * (k + 1) for k in range(3)]  # every step the same shapes
