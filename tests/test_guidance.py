"""Classifier-free guidance: the mixing rule, its exact endpoints, and condition dropout."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import draw_from

from cdlm import rng
from cdlm.denoiser import Prediction
from cdlm.guidance import NO_LABEL, Guidance, Guided, WithLabel, drop_labels
from cdlm.networks.transformer import Transformer
from cdlm.processes import AutoregressiveProcess, GaussianProcess, MaskedProcess
from cdlm.samplers.autoregressive import sample_ar
from cdlm.samplers.gaussian import sample_ddpm
from cdlm.samplers.masked import sample_masked

V, L, CLASSES = 12, 6, 3


class LabelEcho:
    """A stub denoiser whose logits and x0 depend on the label in a known way."""

    def __init__(self, finite: bool = True) -> None:
        self.finite, self.calls = finite, []

    def __call__(self, x, t=None, self_cond=None, label=None):
        self.calls.append(label.clone())
        b = x.shape[0]
        base = torch.arange(V, dtype=torch.float64).expand(b, L, V).clone()
        logits = base * (1.0 + label.double()[:, None, None])
        if not self.finite:
            logits[..., 0] = -math.inf  # like SUBS's [MASK] column
        x0 = label.double()[:, None, None].expand(b, L, 4).clone()
        return Prediction(logits=logits, x0=x0)


def test_guided_mixes_logits_and_x0_as_uncond_plus_w_times_difference():
    label = torch.tensor([2, 0])
    pred = Guided(LabelEcho(), label, scale=2.5)(torch.zeros(2, L, 4), torch.zeros(2))
    cond = torch.arange(V, dtype=torch.float64) * (1.0 + label.double()[:, None])
    uncond = torch.arange(V, dtype=torch.float64) * 0.0  # label -1 -> factor 0
    expected = (uncond + 2.5 * (cond - uncond)).log_softmax(-1)
    torch.testing.assert_close(pred.logits[:, 0], expected)
    torch.testing.assert_close(pred.x0[:, 0, 0], -1.0 + 2.5 * (label.double() + 1.0))


def test_guided_keeps_minus_inf_columns_and_one_pass_at_scales_0_and_1():
    stub = LabelEcho(finite=False)
    pred = Guided(stub, torch.tensor([1]), scale=3.0)(torch.zeros(1, L, 4), torch.zeros(1))
    assert torch.isneginf(pred.logits[..., 0]).all() and not pred.logits.isnan().any()
    assert stub.calls[-1].tolist() == [1, NO_LABEL]  # one batch of 2B
    for scale, seen in ((0.0, NO_LABEL), (1.0, 1)):
        g = Guided(stub, torch.tensor([1]), scale=scale)
        g(torch.zeros(1, L, 4), torch.zeros(1))
        assert g.passes == 1 and stub.calls[-1].tolist() == [seen]


def test_negative_scale_is_refused():
    with pytest.raises(ValueError, match="guidance scale must be >= 0"):
        Guided(LabelEcho(), torch.tensor([0]), scale=-1.0)


def test_condition_dropout_rate():
    labels = torch.zeros(20_000, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    assert (drop_labels(labels, 0.0, g) == 0).all()
    assert (drop_labels(labels, 1.0, g) == NO_LABEL).all()
    assert abs((drop_labels(labels, 0.1, g) == NO_LABEL).float().mean().item() - 0.1) < 0.01


def test_unconditional_network_refuses_a_label():
    net = Transformer(
        out_dim=V,
        in_vocab=V,
        d_model=16,
        n_layers=1,
        n_heads=2,
        max_seq_len=8,
        self_condition=False,
    )
    with pytest.raises(ValueError, match="trained without labels"):
        net(torch.zeros(1, L, dtype=torch.long), torch.zeros(1), label=torch.tensor([0]))


def conditional(process, **kw):
    torch.manual_seed(0)
    net = Transformer(
        **process.network_kwargs,
        d_model=16,
        n_layers=1,
        n_heads=2,
        max_seq_len=L + 1,
        num_classes=CLASSES,
        **kw,
    )
    torch.nn.init.normal_(net.label_embed.weight, std=1.0)  # make cond != uncond
    for block in net.blocks:
        torch.nn.init.normal_(block.ada.weight, std=0.2)
    return net.eval()


class Tok:
    eos_token_id = 1

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


CASES = [
    ("gaussian", lambda: GaussianProcess(V, embed_dim=4), sample_ddpm),
    ("masked", lambda: MaskedProcess(V, mask_id=V - 1, eos_id=1), sample_masked),  # ancestral
    ("autoregressive", lambda: AutoregressiveProcess(V, bos_id=1), sample_ar),
]


@pytest.mark.parametrize("kind, make, sampler", CASES, ids=[c[0] for c in CASES])
def test_scale_0_is_unconditional_and_scale_1_conditional_for_every_process(kind, make, sampler):
    process = make().eval()
    net = conditional(process)

    def run(guidance=None, condition=None):
        if condition is None:
            out = draw_from(
                process,
                net,
                Tok(),
                sampler,
                steps=5,
                num_samples=6,
                seq_len=L,
                seed=7,
                cut_at_eos=False,
                guidance=guidance,
            )
            return [s.token_ids for s in out.samples], out.nfe
        den = process.sampling_denoiser(net, condition=condition)
        gen = rng.generator(7)  # the stream generate(seed=7) uses
        grid = torch.linspace(1, 0, 6, dtype=torch.float64)
        x = process.prior((6, L), torch.device("cpu"), gen)
        return sampler(den, x, grid, process=process, generator=gen).tokens.tolist(), None

    uncond, _ = run()
    cond, _ = run(condition=lambda d: WithLabel(d, torch.full((6,), 2)))
    assert uncond != cond  # the label matters, so the checks below can fail
    assert run(Guidance(label=2, scale=0.0))[0] == uncond
    assert run(Guidance(label=2, scale=1.0))[0] == cond
    guided, nfe = run(Guidance(label=2, scale=4.0))
    _, nfe_plain = run(Guidance(label=2, scale=1.0))
    assert guided != cond and nfe == 2 * nfe_plain


def test_two_pass_mix_at_scale_1_matches_the_conditional_pass():
    """The general mixing path (not the one-pass shortcut) is the conditional model at w = 1."""
    process = MaskedProcess(V, mask_id=V - 1, eos_id=1).eval()
    net = conditional(process)
    den = process.make_denoiser(net)
    z = torch.tensor([[V - 1, 3, V - 1, 4, V - 1, V - 1]])
    guided = Guided(den, torch.tensor([2]), scale=1.0)
    guided.passes = 2
    mixed = guided(z, torch.zeros(1)).logits
    plain = den(z, torch.zeros(1), label=torch.tensor([2])).logits
    finite = torch.isfinite(plain)
    assert torch.equal(finite, torch.isfinite(mixed))
    torch.testing.assert_close(mixed[finite], plain[finite], atol=1e-5, rtol=1e-5)


def test_one_label_per_sample_is_sliced_per_batch():
    g = Guidance(label=[0, 2, 1, 1], scale=2.0)
    wrapped = g.wrap(LabelEcho(), batch=2, device=torch.device("cpu"), first=2)
    assert wrapped.label.tolist() == [1, 1]
    assert Guidance(label=None).wrap(stub := LabelEcho(), 2, torch.device("cpu")) is stub
