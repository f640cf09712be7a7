"""Self-conditioning composed with the posterior (soft-token) input (issue 39's first lever):
the previous x0 estimate enters beside the soft token it estimates when on, zeros when off, never
carries a gradient, is carried between sampling calls, and the model round-trips through a
model file."""

from __future__ import annotations

import pytest
import torch
from conftest import run_main, train_tiny

from cdlm.model import save_model
from cdlm.model_file import load_model
from cdlm.networks.transformer import Transformer
from cdlm.processes import GaussianProcess
from cdlm.processes.inputs import PosteriorInput

V, D, L = 10, 4, 6


def built(shift: bool = True, p: float = 0.5) -> tuple[GaussianProcess, Transformer]:
    torch.manual_seed(0)
    proc = GaussianProcess(V, embed_dim=D, input=PosteriorInput(shift, self_cond_prob=p), eos_id=0)
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=9)
    with torch.no_grad():  # off adaLN-Zero's identity start, so the estimate reaches the output
        for q in net.parameters():
            q.add_(0.1 * torch.randn_like(q))
    return proc, net


def seen_by_projection(net: Transformer) -> list[torch.Tensor]:
    """What each network call feeds the self-conditioning projection."""
    seen: list[torch.Tensor] = []
    net.self_cond_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    return seen


def test_network_widths_and_refusals():
    proc, net = built()
    assert proc.network_kwargs == {
        "in_vocab": V,
        "self_condition": True,
        "self_cond_dim": D,
        "out_dim": V,
    }
    assert net.self_cond_proj.in_features == D
    off, _ = built(p=0.0)
    assert (
        off.network_kwargs["self_condition"] is False and "self_cond_dim" not in off.network_kwargs
    )
    with pytest.raises(ValueError, match="self_cond_dim"):
        Transformer(out_dim=V, in_vocab=V, self_condition=True)


@pytest.mark.parametrize("shift", [False, True])
def test_the_estimate_enters_beside_its_token_and_zeros_stand_in_when_off(shift: bool):
    proc, net = built(shift)
    seen, den = seen_by_projection(net), proc.make_denoiser(net.eval())
    x, t = torch.randn(2, L, D), torch.full((2,), 0.6)
    estimate = torch.randn(2, L, D)
    with_it, without = den(x, t, estimate).logits, den(x, t).logits
    assert not torch.allclose(with_it, without)  # the estimate reaches the output
    expected = torch.cat([torch.zeros(2, 1, D), estimate], 1) if shift else estimate
    torch.testing.assert_close(seen[0], expected)  # row i + 1 holds token i's estimate
    torch.testing.assert_close(seen[1], torch.zeros_like(expected))  # off: zeros
    torch.testing.assert_close(den(x, t, torch.zeros(2, L, D)).logits, without)


def test_training_feeds_a_gradient_free_estimate_on_its_share_of_batches():
    proc, net = built(p=1.0)
    proc.train()
    den, calls = proc.make_denoiser(net), []

    def recording(x_t, t, self_cond=None):
        calls.append(self_cond)
        return den(x_t, t, self_cond)

    ids = torch.randint(1, V, (3, L))
    loss = proc.loss(recording, {"tokens": ids}, torch.Generator().manual_seed(0)).loss
    assert calls[0] is None and calls[1] is not None  # a first pass, then its estimate
    assert not calls[1].requires_grad and calls[1].grad_fn is None
    loss.backward()  # the gradient reaches the projection through the second pass only
    assert net.self_cond_proj.weight.grad.abs().sum() > 0
    never, _ = built(p=0.0)
    never.train()
    calls.clear()
    den = never.make_denoiser(net)
    never.loss(recording, {"tokens": ids}, torch.Generator().manual_seed(0))
    assert calls == [None]
    # p = 0.5: the coin self-conditions about half the batches (binomial, 200 batches, 5 SE)
    half, net = built(p=0.5)
    half.train()
    den, counted = half.make_denoiser(net), 0
    for seed in range(200):
        calls.clear()
        half.loss(recording, {"tokens": ids}, torch.Generator().manual_seed(seed))
        counted += len(calls) == 2
    assert abs(counted - 100) < 5 * (200 * 0.25) ** 0.5


def test_sampling_carries_the_previous_estimate():
    proc, net = built(shift=True)
    seen = seen_by_projection(net)
    den = proc.sampling_denoiser(net.eval())
    x = torch.randn(2, L, D)
    first = den(x, torch.full((2,), 0.9))
    den(x, torch.full((2,), 0.5))
    torch.testing.assert_close(seen[0], torch.zeros(2, L + 1, D))
    torch.testing.assert_close(seen[1][:, 1:], first.x0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_corpus):
    return train_tiny(
        tmp_path_factory,
        tiny_corpus,
        "input@process.input=posterior",
        "process.input.self_cond_prob=0.5",
    )


def test_a_trained_model_round_trips_through_a_model_file(trained, tmp_path):
    model = load_model(trained)
    assert model.process.input.self_cond_prob == 0.5
    assert model.network.self_cond_proj.in_features == model.process.embed_dim
    again = tmp_path / "again.safetensors"
    save_model(again, model)
    copy = load_model(again)
    torch.manual_seed(0)
    x, t = torch.randn(2, 16, model.process.embed_dim), torch.full((2,), 0.7)
    estimate = torch.randn_like(x)
    for self_cond in (None, estimate):
        torch.testing.assert_close(
            copy.denoiser(x, t, self_cond).logits, model.denoiser(x, t, self_cond).logits
        )
    a, b = (
        model.process.sampling_denoiser(model.network),
        copy.process.sampling_denoiser(copy.network),
    )
    for level in (0.9, 0.4):
        tt = torch.full((2,), level)
        torch.testing.assert_close(a(x, tt).logits, b(x, tt).logits)
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample", f"ckpt={again}", "steps=3", "num_samples=2", f"out={out}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.is_file()
