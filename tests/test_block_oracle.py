"""The shifted block oracle (issue 39): the exact posterior of what each query sees, whose bound
is a bound over the world's sequences though it may sit below one sequence's NLL."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from test_worlds import enumerate_world, tiny_world

from cdlm.configs import compose
from cdlm.model_file import oracle_model

SHIFTED = ["process=block", "process.block_size=2"]
UNSHIFTED = [*SHIFTED, "process.shift=false", "process.causal_clean=false", "process.ar_weight=0"]


def block_oracle(overrides: list[str]):
    world = tiny_world(length=4)
    model = oracle_model(world, compose("train", overrides).process)
    model.process.eval()
    return world, model.process, model.process.make_denoiser(model.network)


def test_shifted_block_oracle_is_the_posterior_of_what_a_query_sees():
    """Every mask pattern of one row: a masked position's prediction is the world's posterior
    given the blocks before its own and its block's unmasked tokens except the block's last
    (the shifted layout never shows a block its own last token)."""
    world, process, denoiser = block_oracle(SHIFTED)
    seqs, p = enumerate_world(world, 4)
    row, mask = torch.tensor([[3, 4, 5, 3]]), process.mask_id
    for pattern in itertools.product([False, True], repeat=4):
        z = torch.where(torch.tensor([pattern]), mask, row)
        with torch.no_grad():
            noisy, _ = denoiser.streams(z, row)
        got = noisy.log_softmax(-1)[0, :, 3:6].double().exp()
        for i in [i for i in range(4) if pattern[i]]:
            block = i // 2
            seen = [j for j in range(4) if j < 2 * block or (
                j // 2 == block and j != 2 * block + 1 and not pattern[j])]  # fmt: skip
            keep = torch.ones(len(seqs), dtype=torch.bool)
            for j in seen:
                keep &= seqs[:, j] == row[0, j]
            exact = torch.zeros(3, dtype=torch.float64).index_add_(0, seqs[keep, i] - 3, p[keep])
            torch.testing.assert_close(got[i], exact / exact.sum(), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("overrides", "above"), [(SHIFTED, True), (UNSHIFTED, False)])
def test_block_oracle_bound_over_the_worlds_sequences(overrides, above):
    """Averaged over the world's sequences by their probability, the shifted oracle's bound is
    above the entropy (its model is not the world) and the unshifted one's equals it; the
    shifted bound of one sequence may still sit below that sequence's NLL."""
    world, process, denoiser = block_oracle(overrides)
    seqs, p = enumerate_world(world, 4)
    entropy = float(-(p * p.log()).sum())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        bound = torch.tensor([
            float(process.loss(denoiser, {"tokens": s[None].repeat(4096, 1)}, generator).loss) * 4
            for s in seqs
        ], dtype=torch.float64)  # fmt: skip
    mean = float((p * bound).sum())
    # 4096 stratified draws per sequence: the weighted mean's noise is ~0.005 nats
    if above:
        assert mean > entropy + 0.01, (mean, entropy)
        assert float(p[bound < -p.log() - 0.1].sum()) > 0.1  # below the truth on some rows
    else:
        assert math.isclose(mean, entropy, abs_tol=0.02), (mean, entropy)
