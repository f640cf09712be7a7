"""The sparse transition reference (cdlm/worlds/reference.py): a chain's rates and likelihoods
read from its own top-K transition equal those of the dense (V, V) table, exactly."""

from __future__ import annotations

import math

import pytest
import torch

from cdlm.evaluation.world_score import transition_rates
from cdlm.worlds.base import World
from cdlm.worlds.chain import CharChain
from cdlm.worlds.reference import ChainReference, DenseReference

CORPUS = "the cat sat on the mat and the dog ate the hat by the gate at night\n" * 3


@pytest.fixture(scope="module", params=[(5, 0.01), (None, 0.0)], ids=["topk", "dense"])
def chain(request, tmp_path_factory) -> CharChain:
    path = tmp_path_factory.mktemp("ref") / "corpus.txt"
    path.write_text(CORPUS)
    top_k, teleport = request.param
    return CharChain(path=str(path), length=12, top_k=top_k, teleport=teleport)


def dense_table(chain: CharChain) -> torch.Tensor:
    """The (V, V) table on token ids, made dense row by row (what the reference avoids)."""
    v, s = chain.vocab_size, chain.initial.numel()
    out = torch.zeros(v, v, dtype=torch.float64)
    out[chain.offset : chain.offset + s, chain.offset : chain.offset + s] = chain.step(1).rows(
        torch.arange(s)
    )
    return out


def test_sparse_rates_equal_the_dense_tables_exactly(chain):
    sparse, dense = chain.transition_reference(), DenseReference(dense_table(chain))
    assert isinstance(sparse, ChainReference) and sparse.vocab_size == chain.vocab_size
    g = torch.Generator().manual_seed(0)
    sets = {
        "exact": chain.sample(16, 12, generator=g),
        "any emitted": torch.randint(chain.offset, chain.vocab_size, (16, 12), generator=g),
        "specials too": torch.randint(0, chain.vocab_size, (16, 12), generator=g),
    }
    for name, tokens in sets.items():
        a, b = tokens[:, :-1].flatten(), tokens[:, 1:].flatten()
        assert torch.equal(sparse.prob(a, b), dense.prob(a, b)), name
        assert torch.equal(sparse.visited(a), dense.visited(a)), name
        assert transition_rates(tokens, sparse) == transition_rates(tokens, dense), name
    exact = transition_rates(sets["exact"], sparse)
    assert math.isfinite(exact.kl) and 0 < exact.tv < 1
    assert transition_rates(sets["specials too"], sparse).kl == math.inf  # pad/eos: never made


def test_the_chains_own_likelihood_is_the_forward_passes(chain):
    g = torch.Generator().manual_seed(1)
    tokens = torch.cat(
        [chain.sample(6, 12, generator=g), torch.randint(3, 30, (2, 12), generator=g)]
    )
    tokens[-1, 4] = 0  # a pad the world never emits: probability 0
    own, forward = chain.log_prob(tokens), World.log_prob(chain, tokens)
    assert torch.isinf(own[-1]) and torch.isinf(forward[-1])
    assert torch.allclose(own[:-1], forward[:-1], rtol=1e-12, atol=0)
