"""The autoregressive baseline: exact NLL, KV cache, and sampling."""

import math

import pytest
import torch
import torch.nn.functional as F

from cdlm.networks.transformer import Transformer
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.samplers import check_compatible, uniform_grid
from cdlm.samplers.autoregressive import sample_ar

V, BOS = 11, 10


def causal_net():
    torch.manual_seed(0)
    net = Transformer(
        out_dim=V,
        in_vocab=V,
        d_model=32,
        n_layers=2,
        n_heads=2,
        max_seq_len=16,
        self_condition=False,
        causal=True,
    ).double()
    for p in net.parameters():  # leave the adaLN-Zero identity start: make every path matter
        p.data += 0.05 * torch.randn_like(p)
    return net


def test_kv_cached_logits_equal_uncached():
    net = causal_net()
    tokens = torch.randint(0, V, (3, 9))
    t = torch.zeros(3, dtype=torch.float64)
    full = net(tokens, t)
    cache = net.new_cache()
    steps = [net(tokens[:, i : i + 1], t, cache=cache) for i in range(9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=1e-10)
    cache = net.new_cache()  # a prefill followed by single steps agrees too
    prefill = net(tokens[:, :5], t, cache=cache)
    rest = [net(tokens[:, i : i + 1], t, cache=cache) for i in range(5, 9)]
    torch.testing.assert_close(torch.cat([prefill, *rest], 1), full, atol=1e-10, rtol=1e-10)


def test_loss_is_exact_next_token_nll():
    net = causal_net()
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    tokens = torch.randint(0, BOS, (2, 7))
    out = process.loss(process.make_denoiser(net), {"tokens": tokens})
    inputs = torch.cat([torch.full((2, 1), BOS), tokens[:, :-1]], 1)
    logits = net(inputs, torch.zeros(2, dtype=torch.float64))
    expected = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-9)
    assert out.metrics["bits_per_token"].item() == pytest.approx(expected.item() / math.log(2))
    # PAD (valid=False) is left out: the NLL of the valid tokens only
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[0, 5:] = valid[1, 3:] = False
    padded = process.loss(process.make_denoiser(net), {"tokens": tokens, "valid": valid})
    expected = F.cross_entropy(logits[valid], tokens[valid])
    assert padded.loss.item() == pytest.approx(expected.item(), rel=1e-9)


def test_cached_and_uncached_sampling_agree_and_stop_at_eos():
    net = causal_net()
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    den = process.make_denoiser(net)
    outs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(5)
        x = process.prior((4, 12), torch.device("cpu"), g)
        outs.append(
            sample_ar(den, x, uniform_grid(1), process=process, generator=g, use_cache=use_cache)
        )
    cached, uncached = outs
    assert torch.equal(cached.tokens, uncached.tokens)
    assert cached.nfe == uncached.nfe and cached.positions == cached.nfe
    assert uncached.positions == sum(range(1, uncached.nfe + 1))
    for row in cached.tokens.tolist():  # after the first EOS there is only EOS
        if BOS in row:
            assert set(row[row.index(BOS) :]) == {BOS}


def test_ar_sampler_fits_only_the_ar_process():
    check_compatible(sample_ar, "autoregressive")
    with pytest.raises(ValueError, match="use one of: ancestral, cached_ancestral"):
        check_compatible(sample_ar, "masked")


def test_token_input_rejects_self_conditioning_and_needs_one_input_mode():
    with pytest.raises(ValueError, match="self_condition"):
        Transformer(out_dim=V, in_vocab=V, self_condition=True)
    with pytest.raises(ValueError, match="exactly one"):
        Transformer(out_dim=V, in_dim=4, in_vocab=V)
    # a bidirectional network has a cache too: one pass through an empty one is a plain pass
    bidirectional = Transformer(
        out_dim=V, in_vocab=V, self_condition=False, d_model=16, n_layers=1, n_heads=2
    ).eval()
    tokens, t = torch.randint(0, V, (2, 5)), torch.zeros(2)
    cache = bidirectional.new_cache()
    torch.testing.assert_close(bidirectional(tokens, t, cache=cache), bidirectional(tokens, t))
    assert cache.length == 5


def test_sampling_can_fill_the_whole_canvas_past_eos():
    net = causal_net()
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    g = torch.Generator().manual_seed(5)
    x = process.prior((4, 12), torch.device("cpu"), g)
    out = sample_ar(
        process.make_denoiser(net),
        x,
        uniform_grid(1),
        process=process,
        generator=g,
        stop_at_eos=False,
        temperature=3.0,
    )
    assert out.nfe == 12 and out.positions == 12


def test_a_prompt_is_prefilled_in_one_call():
    """With the cache, the fixed prompt costs one network call (positions: the prompt and each
    new token once); greedy samples equal the uncached token-by-token reference."""
    net = causal_net()
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    prompt = torch.tensor([[3, 4, 5, 6, 7], [1, 2, 3, 4, 5]])
    ids = torch.cat([prompt, torch.zeros(2, 7, dtype=torch.long)], 1)
    editable = torch.arange(12).expand(2, -1) >= 5
    outs = []
    for use_cache in (True, False):
        den = process.hold_fixed(process.make_denoiser(net), ids, editable, None)
        x = process.prior((2, 12), torch.device("cpu"), None)
        outs.append(
            sample_ar(
                den,
                x,
                uniform_grid(1),
                process=process,
                temperature=0.0,
                use_cache=use_cache,
                stop_at_eos=False,
            )
        )
    cached, uncached = outs
    assert torch.equal(cached.tokens, uncached.tokens)
    assert torch.equal(cached.tokens[:, :5], prompt)
    assert cached.nfe == 12 - 4 and uncached.nfe == 12  # one prefill of BOS + 4 prompt tokens
    assert cached.positions == 12
