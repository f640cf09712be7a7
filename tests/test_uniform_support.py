"""process=uniform's noise support (``cdlm.processes.uniform_support``, issue 51): its bound is
exact by brute force on a support smaller than the vocabulary, no step of training or decoding
can put an excluded id on the canvas, and the data decides which ids are excluded."""

import itertools

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from cdlm.configs import compose
from cdlm.model import build
from cdlm.processes.uniform import UniformProcess
from cdlm.processes.vocabulary import token_ids
from cdlm.samplers import uniform_grid
from cdlm.samplers.uniform import sample_duo_ancestral, sample_duo_psi

V, OUT = 7, [0, 1, 2]  # three specials the data never holds, four tokens it does
B, L = 16, 10


def test_the_bound_on_a_support_is_exact_by_brute_force():
    """On a joint over K = 3 of V = 4 ids, with x0_hat the leave-one-out posterior under noise
    over the K ids (zero mass on the fourth), the process's ELBO integrand integrated over
    alpha from 1 to 0 is -log p(x) for every sequence (quadrature in t, float64). The
    whole-vocabulary bound would count the fourth id among the noise's states."""
    from scipy import integrate

    vocab, length, f64 = 4, 2, torch.float64
    process = UniformProcess(vocab_size=vocab, excluded=[0]).eval()
    states = process.support.ids.tolist()
    assert states == [1, 2, 3]
    k = len(states)
    seqs = torch.tensor(list(itertools.product(states, repeat=length)))
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(len(seqs), generator=g, dtype=f64), 0)
    zs = seqs  # every corruption: the noise never leaves the support

    def q(a: float, x: torch.Tensor, at: list[int]) -> torch.Tensor:
        return (a * (zs[:, at] == x[at]) + (1 - a) / k).prod(-1)  # (Z,) q(z at ``at`` | x)

    def leave_one_out(a: float) -> torch.Tensor:  # (Z, L, V) log p(x0_l = v | z without l)
        out = []
        for pos in range(length):
            others = [m for m in range(length) if m != pos]
            post = torch.stack([q(a, s, others) for s in seqs], 1) * p
            onehot = nn.functional.one_hot(seqs[:, pos], vocab).double()
            out.append((post / post.sum(1, keepdim=True)) @ onehot)
        return torch.stack(out, 1).log()  # -inf on id 0, as the process's denoiser gives it

    def integrand(t: float, x: torch.Tensor) -> float:
        a, n = 1.0 - t, len(zs)
        alpha, dalpha = torch.full((n,), a, dtype=f64), torch.full((n,), -1.0, dtype=f64)
        per = process.integrand(leave_one_out(a), zs, x.expand_as(zs), alpha, dalpha).sum(-1)
        return float((q(a, x, list(range(length))) * per).sum())

    for x, px in zip(seqs[::4], p[::4], strict=True):  # three of the nine, for time
        bound = integrate.quad(integrand, 0, 1, args=(x,), epsabs=1e-10, epsrel=1e-8, limit=200)
        assert bound[0] == pytest.approx(float(-px.log()), rel=1e-7)


class LovesSpecials(nn.Module):
    """A network whose logits favour the excluded ids by e^8: what a model that never learnt
    to avoid them would do at its worst."""

    def forward(self, x: torch.Tensor, t: torch.Tensor, **kwargs) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(x.sum()) % 1000)
        logits = torch.randn(*x.shape, V, generator=g)
        logits[..., OUT] += 8.0
        return logits


def test_no_special_token_can_be_drawn():
    """Training's corruptions (exact, complementary, the curriculum's relaxed argmax, the
    distillation trajectory), the prior, and every sampler's steps, drawn or greedy, stay on
    the support even when the network prefers the excluded ids; x0_hat gives them no mass."""
    process = UniformProcess(vocab_size=V, excluded=OUT).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, V, (B, L), generator=g)
    t = torch.linspace(0.01, 0.999, B)
    seen = [process.prior((4096,), torch.device("cpu"), g), process.corrupt(tokens, t, g).x_t]
    seen += list(process.trajectory(tokens, t, t / 2, g))
    seen.append(process.relax(tokens, t, g).x_t)
    process.train()
    process.complementary = True
    network = LovesSpecials()
    assert torch.isfinite(process.loss(process.make_denoiser(network), {"tokens": tokens}, g).loss)
    process.eval()
    denoiser = process.make_denoiser(network)
    logits = denoiser(seen[1], t).logits
    assert bool((logits[..., OUT] == -torch.inf).all())
    x = process.prior((B, L), torch.device("cpu"), g)
    for sampler, last in itertools.product(
        (sample_duo_ancestral, sample_duo_psi), ("draw", "greedy")
    ):
        out = sampler(
            denoiser, x, uniform_grid(16), process=process, generator=g, last_step=last,
            callback=lambda step: seen.append(step.x),
        )  # fmt: skip
        seen.append(out.x)
    ids = torch.cat([s.reshape(-1) for s in seen])
    assert int(ids.min()) >= 3, "an excluded id was drawn"
    assert set(ids.tolist()) == {3, 4, 5, 6}  # and every support id was


def test_the_whole_vocabulary_draws_the_specials_too():
    """The same network without the support (``excluded=[]``, model files written before it)
    does draw the excluded ids: what the support takes away."""
    process = UniformProcess(vocab_size=V).eval()
    g = torch.Generator().manual_seed(0)
    x = process.prior((B, L), torch.device("cpu"), g)
    out = sample_duo_ancestral(
        process.make_denoiser(LovesSpecials()), x, uniform_grid(16), process=process, generator=g
    )
    assert int(out.x.min()) < 3


def test_training_tokens_outside_the_support_are_refused():
    process = UniformProcess(vocab_size=V, excluded=OUT)
    denoiser, g = process.make_denoiser(LovesSpecials()), torch.Generator().manual_seed(0)
    tokens = torch.randint(3, V, (2, L), generator=g)
    tokens[1, -2:] = 1  # PAD at unscored positions: allowed
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, -2:] = False
    assert torch.isfinite(process.loss(denoiser, {"tokens": tokens, "valid": valid}, g).loss)
    with pytest.raises(ValueError, match="token id 1 is in the data but outside"):
        process.loss(denoiser, {"tokens": tokens}, g)
    with pytest.raises(ValueError, match=r"ids \[9\] are outside the vocabulary of 7"):
        UniformProcess(vocab_size=V, excluded=[9])


def test_the_data_decides_the_support():
    """process=uniform's ``excluded`` is filled in from the tokenizer and what the data holds:
    a world's rows hold no special (all three out), text's hold EOS (kept); a list given is
    kept; a stored config without the key (a model file from before) draws from all V."""
    from cdlm import worlds

    tokenizer = worlds.load("world:chars").tokenizer
    cfg = compose("train", ["process=uniform"]).process
    world = token_ids(cfg, tokenizer, held=())["excluded"]
    assert world == sorted(tokenizer.all_special_ids) == [0, 1, 2]
    text = token_ids(cfg, tokenizer, held=[tokenizer.eos_token_id])["excluded"]
    assert text == [tokenizer.pad_token_id, tokenizer.mask_token_id]
    whole = compose("train", ["process=uniform", "process.excluded=[]"]).process
    assert "excluded" not in token_ids(whole, tokenizer)
    stored = OmegaConf.to_container(cfg, resolve=False) | {"vocab_size": len(tokenizer)}
    stored.pop("excluded")
    stored = OmegaConf.to_container(OmegaConf.create({"process": stored, "mask_schedule": {
        "_target_": "cdlm.schedules.LogLinearMaskSchedule"}}), resolve=True)  # fmt: skip
    old = build(None, stored, "process")
    assert old.support.whole and old.support.size == len(tokenizer)
