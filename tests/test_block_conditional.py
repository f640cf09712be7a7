"""Block decoding given fixed text (issue 50) on a tiny world's exact oracle: a prompt that ends
inside a block is held as the exact conditional (exact-k at k = 1, both layouts), while the MDLM
rule at one token per call only on average is not; fixed text in a later block than a free
position cannot be seen, and cdlm says so."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from scipy import stats
from test_block_oracle import SHIFTED, UNSHIFTED
from test_worlds import enumerate_world, tiny_world

from cdlm.configs import compose
from cdlm.generation import Plan
from cdlm.generation.generate import generate
from cdlm.model_file import oracle_model
from cdlm.regions import Layout
from cdlm.samplers.blockwise import unseen_fixed
from cdlm.samplers.masked import sample_block
from cdlm.samplers.rules import Ancestral, ExactK

L = 6  # blocks of 2: [0, 2), [2, 4), [4, 6)


def canvas(ids: list[int | None], mask_id: int) -> Layout:
    """A layout holding ``ids`` and free where None."""
    return Layout(
        ids=[mask_id if i is None else i for i in ids],
        editable=[i is None for i in ids],
        spans=[],
        segments=[],
    )


def conditional_p(world, ids: list[int | None], samples: torch.Tensor) -> float:
    """Chi-square p-value of ``samples`` (N, L) against the world's conditional given the fixed
    ``ids``, by enumeration; a sample that breaks the fixed text fails outright."""
    seqs, p = enumerate_world(world, L)
    keep = torch.ones(len(seqs), dtype=torch.bool)
    for i, v in enumerate(ids):
        if v is not None:
            keep &= seqs[:, i] == v
    seqs, p = seqs[keep], p[keep] / p[keep].sum()
    index = {tuple(s.tolist()): i for i, s in enumerate(seqs)}
    counts = torch.zeros(len(seqs))
    for row in samples:
        counts[index[tuple(row.tolist())]] += 1  # KeyError: fixed text not held
    return float(stats.chisquare(counts, p * len(samples)).pvalue)


@pytest.mark.parametrize(
    ("overrides", "rule", "exact"),
    [(SHIFTED, ExactK(k=1), True), (UNSHIFTED, ExactK(k=1), True), (SHIFTED, Ancestral(), False)],
)
@pytest.mark.parametrize("prompt", [[4], [4, 5, 3]], ids=["ends_in_block_0", "ends_in_block_1"])
def test_block_decoding_of_a_prompt_mid_block_is_the_exact_conditional(
    overrides, rule, exact, prompt
):
    """3000 continuations of a prompt that ends inside a block, on the oracle with two steps
    per block of 2, against the enumerated conditional by a chi-square test: exact-k at k = 1
    passes in both layouts (p > 0.05); the MDLM rule, which reveals both tokens of a block in
    one step on some draws (one token per call only on average), fails (p < 1e-4)."""
    world = tiny_world(length=L)
    model = oracle_model(world, compose("train", [*overrides, "process.block_size=2"]).process)
    ids = [*prompt, *[None] * (L - len(prompt))]
    layout = canvas(ids, model.process.mask_id)
    sampler = functools.partial(sample_block, rule=rule, steps_per_block=2, stop_at_eos=False)
    plan = Plan(num_samples=3000, seq_len=L, steps=6, seed=0, layout=layout, cut_at_eos=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prompt is seen whole: no warning
        out = generate(model, sampler, plan)
    p = conditional_p(world, ids, torch.tensor([s.token_ids for s in out.samples]))
    assert p > 0.05 if exact else p < 1e-4, p


def test_fixed_text_in_a_later_block_than_a_free_position_is_named():
    """``unseen_fixed``: the first fixed position in a later block than some free position of
    its row; fixed text in a free position's own block or before it is seen."""
    m = 9
    assert unseen_fixed(torch.tensor([[1, 2, m, m, m]]), m, 2) is None  # a prompt
    assert unseen_fixed(torch.tensor([[1, m, 2, m, m]]), m, 4) is None  # same block
    assert unseen_fixed(torch.tensor([[1, m, 2, m, m]]), m, 2) == 2
    assert unseen_fixed(torch.tensor([[1, 2, m, m, 3], [m, 1, 2, 3, 4]]), m, 2) == 2
    assert unseen_fixed(torch.tensor([[1, 2, 3, 4, 5]]), m, 2) is None  # nothing free
    padded = torch.tensor([[1, m, m, 0, 0], [1, 2, m, m, m]])  # row 0: 3 positions, then padding
    assert unseen_fixed(padded, m, 2, lengths=[3, 5]) is None
    assert unseen_fixed(padded, m, 2) == 3


def test_block_decoding_warns_that_it_cannot_see_an_infills_right_side():
    """An infill on a block model: one warning line naming the unseen fixed position."""
    world = tiny_world(length=L)
    model = oracle_model(world, compose("train", [*SHIFTED, "process.block_size=2"]).process)
    layout = canvas([4, None, None, None, None, 5], model.process.mask_id)
    plan = Plan(num_samples=2, seq_len=L, steps=6, seed=0, layout=layout, cut_at_eos=False)
    sampler = functools.partial(sample_block, rule=ExactK(k=1), steps_per_block=2)
    with pytest.warns(UserWarning, match="sees only earlier blocks.*position 5") as caught:
        generate(model, sampler, plan)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
