"""The shifted block layout inherits AR exactly: at block size 1 its logits are the AR model's
on the same weights, its causal clean stream is that AR model at any block size (the verifier
of speculative decoding), and the joint objective adds the AR loss in training only."""

import pytest
import torch

from cdlm.networks.transformer import Transformer
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.block import BlockProcess
from cdlm.schedules import CosineMaskSchedule, LogLinearMaskSchedule

V, MASK, EOS, L = 12, 11, 0, 10


def shifted(size: int, **options) -> BlockProcess:
    return BlockProcess(V, MASK, size, EOS, LogLinearMaskSchedule(), shift=True, **options)


def networks(block: BlockProcess) -> tuple[Transformer, Transformer]:
    """An AR network (causal) and the block network with the very same weights, as
    ``init_from=`` an AR checkpoint gives it (float64, perturbed off the identity init)."""
    ar_process = AutoregressiveProcess(block.vocab_size, EOS)
    torch.manual_seed(0)
    ar = Transformer(
        d_model=16, n_layers=2, n_heads=2, max_seq_len=L + 2, **ar_process.network_kwargs
    )
    for p in ar.parameters():
        p.data += 0.1 * torch.randn_like(p)
    net = Transformer(d_model=16, n_layers=2, n_heads=2, max_seq_len=L + 2, **block.network_kwargs)
    net.load_state_dict(ar.state_dict())  # strict: an AR checkpoint drops in unchanged
    return ar.double().eval(), net.double().eval()


def ar_logits(ar: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """The AR model's next-token outputs 0..L-1 on [BOS, x_0, ..., x_{L-2}]."""
    inputs = torch.cat([torch.full_like(tokens[:, :1], EOS), tokens[:, :-1]], 1)
    return ar(inputs, torch.zeros(tokens.shape[0], dtype=torch.float64))


TOKENS = torch.randint(1, V - 1, (3, L), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("causal_clean", [False, True])
def test_block_size_one_is_the_ar_model(causal_clean):
    block = shifted(1, causal_clean=causal_clean)
    ar, net = networks(block)
    den = block.make_denoiser(net)
    canvas = torch.full_like(TOKENS, MASK)
    t = torch.ones(3, dtype=torch.float64)
    with torch.no_grad():
        want = ar_logits(ar, TOKENS)
        noisy, _ = den.streams(canvas, TOKENS)
        torch.testing.assert_close(noisy, want, atol=1e-12, rtol=0)
        cache = net.new_cache()  # the sampler's path: one window call per position
        for i in range(L):
            canvas = torch.cat([TOKENS[:, :i], torch.full_like(TOKENS[:, i:], MASK)], 1)
            chunk = den.chunk(canvas, torch.tensor([i]), cache)
            torch.testing.assert_close(chunk.window[:, 0], want[:, i], atol=1e-12, rtol=0)
            assert cache.length == i
        full = den(canvas, t, clean=TOKENS, subs=False).logits
        torch.testing.assert_close(
            full,
            want.masked_fill(torch.arange(V) == MASK, float("-inf")).log_softmax(-1),
            atol=1e-12,
            rtol=0,
        )


def test_unshifted_block_size_one_is_not_the_ar_model():
    """The control: the old layout (a position reads its own [MASK]) does not inherit AR."""
    block = BlockProcess(V, MASK, 1, EOS, LogLinearMaskSchedule())
    ar, net = networks(block)
    with torch.no_grad():
        noisy, _ = block.make_denoiser(net).streams(torch.full_like(TOKENS, MASK), TOKENS)
    assert not torch.allclose(noisy, ar_logits(ar, TOKENS), atol=1e-3)


@pytest.mark.parametrize("size", [2, 4])
def test_the_causal_clean_stream_is_the_ar_model_at_any_block_size(size):
    block = shifted(size, causal_clean=True)
    ar, net = networks(block)
    den = block.make_denoiser(net)
    noisy = torch.where(
        torch.rand(TOKENS.shape, generator=torch.Generator().manual_seed(2)) < 0.5, MASK, TOKENS
    )
    with torch.no_grad():
        want = ar_logits(ar, TOKENS)
        _, clean = den.streams(noisy, TOKENS)
        torch.testing.assert_close(clean, want, atol=1e-12, rtol=0)
        torch.testing.assert_close(den.next_token_logits(TOKENS), want, atol=1e-12, rtol=0)
        cache = net.new_cache()  # a window call's clean chunk: next-token logits, cached causally
        chunk = den.chunk(TOKENS, torch.arange(6, 6 + size), cache)
        torch.testing.assert_close(chunk.clean, want[:, :6], atol=1e-12, rtol=0)
        chunk = den.chunk(TOKENS, torch.arange(8, 8 + min(size, 2)), cache)
        torch.testing.assert_close(chunk.clean, want[:, 6:8], atol=1e-12, rtol=0)


def test_the_joint_objective_adds_the_ar_loss_in_training_only():
    block = shifted(4, causal_clean=True, ar_weight=0.5)
    _, net = networks(block)
    den = block.make_denoiser(net)
    batch = {"tokens": TOKENS}
    with torch.no_grad():
        block.train()
        out = block.loss(den, batch, torch.Generator().manual_seed(3))
        alone = (
            shifted(4, causal_clean=True).train().loss(den, batch, torch.Generator().manual_seed(3))
        )
        ar = out.metrics["ar_bits_per_token"] * torch.log(torch.tensor(2.0, dtype=torch.float64))
        torch.testing.assert_close(out.loss, alone.loss + 0.5 * ar)
        block.eval()
        bound = block.loss(den, batch, torch.Generator().manual_seed(3))
        assert torch.isclose(
            bound.loss, bound.metrics["bits_per_token"] * torch.log(torch.tensor(2.0)).double()
        )


def test_the_ar_loss_needs_the_shifted_causal_layout():
    with pytest.raises(ValueError, match="causal_clean=true"):
        shifted(4, ar_weight=1.0)
    with pytest.raises(ValueError, match="shift=true"):
        BlockProcess(V, MASK, 4, EOS, causal_clean=True, ar_weight=1.0)


@pytest.mark.parametrize("schedule", [LogLinearMaskSchedule(), CosineMaskSchedule()])
def test_complementary_masks_swap_what_is_masked(schedule):
    block = BlockProcess(V, MASK, 4, EOS, schedule, shift=True, complementary=True)
    t = block.train().sample_t(3, torch.Generator().manual_seed(4), length=L)
    c = block.corrupt(TOKENS, t, torch.Generator().manual_seed(5))
    both = block.with_complement(c)
    first, other = both.x_t[:3], both.x_t[3:]
    assert torch.equal(first == MASK, other != MASK)
    assert torch.equal(torch.where(first == MASK, other, first), TOKENS)
    # the complement keeps what the first masked: its keep rate is the first one's mask rate,
    # within the levels training uses ([t_min, 1])
    low, high = schedule.keep(torch.tensor([1.0, block.t_min]))
    want = (1 - schedule.keep(t)).clamp(float(low), float(high))
    torch.testing.assert_close(schedule.keep(both.t[3:]), want, atol=1e-6, rtol=0)
