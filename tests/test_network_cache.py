"""The Transformer's KV cache: chunked causal decoding, read-only block steps, truncation and
explicit rotary positions, each checked against one uncached pass in float64."""

import pytest
import torch

from cdlm.networks.cache import KVCache
from cdlm.networks.transformer import Transformer

V, TOL = 11, dict(atol=1e-10, rtol=1e-10)


def net(causal: bool, **kw) -> Transformer:
    torch.manual_seed(0)
    args = dict(out_dim=V, in_vocab=V, d_model=32, n_layers=2, n_heads=2, max_seq_len=32)
    network = Transformer(**(args | dict(self_condition=False, causal=causal) | kw)).double()
    for p in network.parameters():  # leave the adaLN-Zero identity start: make every path matter
        p.data += 0.05 * torch.randn_like(p)
    return network.eval()


def data(batch: int = 3, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (batch, length), generator=g), torch.zeros(
        batch, dtype=torch.float64
    )


def snapshot(cache: KVCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.k.clone(), layer.v.clone()) for layer in cache]


def test_cache_is_list_like_for_both_kinds():
    for causal in (True, False):
        network = net(causal)
        cache = network.new_cache()
        assert len(cache) == 2 and cache.length == 0 and cache[0].length == 0
        network(*data(length=5), cache=cache)
        assert cache.length == 5 and [layer.length for layer in cache] == [5, 5]


@pytest.mark.parametrize("sizes", [(12,), (1,) * 12, (5, 1, 1, 5), (3, 4, 2, 3), (1, 7, 4)])
def test_causal_chunks_of_any_size_equal_one_pass(sizes):
    network = net(causal=True)
    tokens, t = data()
    full = network(tokens, t)
    cache, outs, start = network.new_cache(), [], 0
    for size in sizes:
        outs.append(network(tokens[:, start : start + size], t, cache=cache))
        start += size
    torch.testing.assert_close(torch.cat(outs, 1), full, **TOL)
    assert cache.length == 12


def test_bidirectional_block_against_frozen_prefix():
    """Block diffusion's step: the prefix is cached once, the block is denoised several times
    against it, then committed. The reference is one uncached pass over prefix + block under a
    block-causal mask (the prefix sees only itself, the block sees everything): exactly what
    the cached computation claims to be, built here by a different route, one attention mask
    over the whole sequence, slipped in where the training-time annealed mask goes."""
    network = net(causal=False)
    tokens, t = data()
    p = 7
    visible = torch.ones(12, 12, dtype=torch.bool)
    visible[:p, p:] = False
    network._annealed_mask = lambda length, device: visible
    expected = network(tokens, t)
    del network._annealed_mask

    cache = network.new_cache()
    prefix_out = network(tokens[:, :p], t, cache=cache)
    torch.testing.assert_close(prefix_out, expected[:, :p], **TOL)
    prefix_kv = snapshot(cache)
    for _ in range(3):  # denoising steps: attend to the prefix, write nothing
        with cache.read_only():
            block_out = network(tokens[:, p:], t, cache=cache)
        torch.testing.assert_close(block_out, expected[:, p:], **TOL)
        assert cache.length == p and not cache.frozen
    for (k, v), layer in zip(prefix_kv, cache, strict=True):
        assert torch.equal(k, layer.k) and torch.equal(v, layer.v)
    cache.frozen = True  # the attribute form of read_only()
    network(tokens[:, p:], t, cache=cache)
    assert cache.length == p
    cache.frozen = False
    network(tokens[:, p:], t, cache=cache)  # the committing pass appends the block
    assert cache.length == 12


def test_bidirectional_block_sees_the_cache_and_all_of_itself():
    """Changing a cached token, or the block's last token, changes the block's first outputs."""
    network = net(causal=False)
    tokens, t = data(length=10)
    p = 6

    def block_out(seq):
        cache = network.new_cache()
        network(seq[:, :p], t, cache=cache)
        return network(seq[:, p:], t, cache=cache)

    base = block_out(tokens)
    for i in (0, p + 3):  # a cached position, and the block's last one
        other = tokens.clone()
        other[:, i] = (other[:, i] + 1) % V
        assert (block_out(other) - base)[:, :3].abs().amax() > 1e-6


@pytest.mark.parametrize("causal", [True, False])
def test_truncate_then_reappend_reproduces_the_cache(causal):
    network = net(causal)
    tokens, t = data()
    cache = network.new_cache()
    network(tokens[:, :5], t, cache=cache)
    tail = network(tokens[:, 5:], t, cache=cache)
    before = snapshot(cache)
    cache.truncate(5)
    assert cache.length == 5 and all(layer.length == 5 for layer in cache)
    other = tokens.clone()  # a replaced block is forgotten once truncated
    other[:, 5:] = (other[:, 5:] + 3) % V
    network(other[:, 5:], t, cache=cache)
    cache.truncate(5)
    torch.testing.assert_close(network(tokens[:, 5:], t, cache=cache), tail, **TOL)
    for (k, v), layer in zip(before, cache, strict=True):
        torch.testing.assert_close(layer.k, k, **TOL)
        torch.testing.assert_close(layer.v, v, **TOL)
    cache.truncate(0)
    assert cache.length == 0
    torch.testing.assert_close(network(tokens, t, cache=cache), network(tokens, t), **TOL)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(13)


@pytest.mark.parametrize("causal", [True, False])
def test_explicit_positions(causal):
    network = net(causal)
    tokens, t = data()
    full = network(tokens, t)
    assert torch.equal(network(tokens, t, positions=torch.arange(12)), full)
    per_row = torch.arange(12).expand(3, 12)
    torch.testing.assert_close(network(tokens, t, positions=per_row), full, **TOL)
    cache = network.new_cache()
    network(tokens[:, :4], t, cache=cache)
    tail = network(tokens[:, 4:], t, cache=cache)  # default positions: 4..11
    if causal:
        torch.testing.assert_close(tail, full[:, 4:], **TOL)
    cache.truncate(4)
    explicit = network(tokens[:, 4:], t, cache=cache, positions=torch.arange(4, 12))
    assert torch.equal(explicit, tail)
    cache.truncate(4)
    moved = network(tokens[:, 4:], t, cache=cache, positions=torch.arange(6, 14))
    assert (moved - tail).abs().amax() > 1e-6  # the block now sits 2 further from the prefix


@pytest.mark.parametrize("causal", [True, False])
def test_rotary_is_relative(causal):
    """A whole sequence shifted by a constant offset gives the same output, since attention sees
    only differences of positions. Only to 1e-7 (about 3e-9 here): the rotary tables hold fp32
    values even in a float64 network (see ``Rotary``), and shifted angles round differently."""
    network = net(causal)
    tokens, t = data()
    full = network(tokens, t)
    for offset in (1, 9, 20):
        shifted = network(tokens, t, positions=torch.arange(offset, offset + 12))
        torch.testing.assert_close(shifted, full, atol=1e-7, rtol=1e-7)
    rows = torch.arange(12) + torch.tensor([[0], [5], [17]])  # a different shift per row
    torch.testing.assert_close(network(tokens, t, positions=rows), full, atol=1e-7, rtol=1e-7)


def test_dual_cache_refresh_reproduces_one_pass():
    """Fast-dLLM's dual cache: write [prefix, suffix, block] with their true positions, drop the
    block, then step the block read-only. Bidirectional attention with explicit positions does
    not care about order, so right after the refresh the block's logits equal one plain pass."""
    network = net(causal=False)
    tokens, t = data()
    p, b = 4, 3
    order = torch.cat([torch.arange(p), torch.arange(p + b, 12), torch.arange(p, p + b)])
    full = network(tokens, t)
    cache = network.new_cache()
    refresh = network(tokens[:, order], t, cache=cache, positions=order)
    torch.testing.assert_close(refresh, full[:, order], **TOL)
    cache.truncate(12 - b)
    with cache.read_only():
        block = network(tokens[:, p : p + b], t, cache=cache, positions=torch.arange(p, p + b))
    torch.testing.assert_close(block, full[:, p : p + b], **TOL)
    assert cache.length == 12 - b


def test_bad_positions_and_lengths_are_refused():
    network = net(causal=True)
    tokens, t = data()
    with pytest.raises(ValueError, match="max_seq_len=32"):
        network(tokens, t, positions=torch.arange(25, 37))
    with pytest.raises(ValueError, match="max_seq_len=32"):
        network(tokens, t, positions=torch.arange(-1, 11))
    with pytest.raises(ValueError, match="positions must be"):
        network(tokens, t, positions=torch.arange(11))
    with pytest.raises(ValueError, match="positions must be"):
        network(tokens, t, positions=torch.arange(12.0))
    cache = network.new_cache()
    network(torch.cat([tokens, tokens], 1), t, cache=cache)
    with pytest.raises(ValueError, match="max_seq_len of 32"):  # 24 cached + 12 new
        network(tokens, t, cache=cache)


def test_annealed_mask_unchanged_without_cache_and_refused_with_one():
    """Annealing from causal (future_visibility=0) in training is exactly the causal network."""
    causal, bidirectional = net(causal=True), net(causal=False)
    tokens, t = data()
    bidirectional.train().future_visibility = 0.0
    torch.testing.assert_close(bidirectional(tokens, t), causal(tokens, t), **TOL)
    with pytest.raises(ValueError, match="annealed"):
        bidirectional(tokens, t, cache=bidirectional.new_cache())


def _decode(network: Transformer, cache: KVCache) -> list[torch.Tensor]:
    """Writes, a read-only chunk, one-token steps, a truncation (a rejected draft), a rewrite."""
    tokens, t = data()
    outs = [network(tokens[:, :5], t, cache=cache)]
    with cache.read_only():
        outs.append(network(tokens[:, 5:9], t, cache=cache))
    for i in range(5, 9):
        outs.append(network(tokens[:, i : i + 1], t, cache=cache))
    cache.truncate(6)
    outs.append(network(tokens[:, 6:12], t, cache=cache))
    return outs


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("capacity", [3, 32])
def test_preallocated_cache_matches_the_concatenating_one_exactly(causal, capacity):
    """The preallocated cache (``PreallocatedLayerCache``, the network's default) against the
    concatenating one, at a small capacity through growth: every output and every cached key
    and value bit for bit."""
    network = net(causal)
    assert network.new_cache()[0].capacity == 32  # the rotary table's max_seq_len
    caches = KVCache(2), KVCache(2, capacity=capacity)
    plain, buffered = (_decode(network, c) for c in caches)
    assert all(torch.equal(a, b) for a, b in zip(plain, buffered, strict=True))
    assert caches[1].length == caches[0].length == 12
    for a, b in zip(*caches, strict=True):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
