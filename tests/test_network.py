import pytest
import torch

from cdlm.networks.transformer import Transformer


def tiny(**kw):
    args = dict(in_dim=8, out_dim=11, d_model=32, n_layers=2, n_heads=2, max_seq_len=16)
    return Transformer(**(args | kw))


def test_shapes_and_self_condition_default():
    net = tiny()
    x, t = torch.randn(3, 10, 8), torch.rand(3)
    out = net(x, t)
    assert out.shape == (3, 10, 11)
    torch.testing.assert_close(out, net(x, t, torch.zeros_like(x)))


def test_bf16_autocast_runs_and_is_close():
    torch.manual_seed(0)
    net = tiny()
    for p in net.parameters():  # adaLN-Zero starts as identity; perturb it to test the real path
        p.data += 0.02 * torch.randn_like(p)
    x, t = torch.randn(2, 10, 8), torch.rand(2)
    ref = net(x, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = net(x, t)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 0.1 * ref.abs().max()


def test_bidirectional_sees_the_future_causal_does_not():
    torch.manual_seed(0)
    for causal in (False, True):
        net = tiny(causal=causal)
        for p in net.parameters():
            p.data += 0.05 * torch.randn_like(p)
        x, t = torch.randn(1, 8, 8), torch.rand(1)
        y = x.clone()
        y[:, -1] += 1.0  # change only the last position
        changed = (net(x, t) - net(y, t)).abs().amax(-1)[0, :-1]
        assert (changed > 1e-6).any() != causal


def test_bad_head_split_is_refused():
    with pytest.raises(ValueError, match="n_heads"):
        tiny(d_model=30, n_heads=4)
