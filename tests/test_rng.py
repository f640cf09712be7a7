"""Sampling/evaluation noise must not replay the training seed's stream."""

from __future__ import annotations

import torch

from cdlm import rng
from cdlm.processes import GaussianProcess


def max_cosine(noise: torch.Tensor, table: torch.Tensor) -> float:
    n = torch.nn.functional.normalize(noise.reshape(-1, table.shape[1]), dim=-1)
    return float((n @ torch.nn.functional.normalize(table, dim=-1).T).max())


def test_sampling_noise_is_not_the_embedding_initialisation():
    torch.manual_seed(0)  # what cdlm-train's seed_everything(0) does before building the process
    proc = GaussianProcess(500, embed_dim=16)
    table = proc.embedding.weight.detach()  # untrained rows keep these initial values
    replayed = torch.randn((4, 8, 16), generator=torch.Generator().manual_seed(0))
    assert max_cosine(replayed, table) > 0.999  # the collision this module exists to avoid
    mixed = proc.prior((4, 8), torch.device("cpu"), rng.generator(0))
    assert max_cosine(mixed, table) < 0.9


def test_mixed_seeds_are_deterministic_and_distinct():
    assert rng.mixed_seed(0) == rng.mixed_seed(0)
    assert len({rng.mixed_seed(s) for s in range(1000)} | set(range(1000))) == 2000
    a = torch.rand(3, generator=rng.generator(5))
    torch.testing.assert_close(a, torch.rand(3, generator=rng.generator(5)))


def test_sets_drawn_with_different_seeds_share_no_member_seed():
    """Member i of a set drawn with seed s takes ``member_seed(s, i)``: the first is s itself
    (a set of one is the sample drawn alone), and sets of 64 with seeds 0..99 share none (with
    ``s + i`` neighbouring sets shared 63 of 64)."""
    sets = [{rng.member_seed(s, i) for i in range(64)} for s in range(100)]
    assert all(rng.member_seed(s, 0) == s for s in range(100))
    assert len(set().union(*sets)) == 64 * 100
    assert rng.member_seed(-3, 2) == rng.member_seed(-3, 2) >= 0


def test_guidance_blanks_are_no_seeds_sampling_stream():
    """The blanks of a guided sample drawn with seed s are not the sampling stream of seed
    s + 1 (nor of s), as ``generator(s + 1)`` made them."""
    blanks = torch.rand(8, generator=rng.blanks_generator(0))
    for s in range(3):
        assert not torch.equal(blanks, torch.rand(8, generator=rng.generator(s)))
    torch.testing.assert_close(blanks, torch.rand(8, generator=rng.blanks_generator(0)))
