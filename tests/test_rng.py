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
