"""process=uniform beyond the contracts: infilling holds the fixed tokens at every step, editing
starts from the noised text, and what the process cannot do it refuses in one line."""

import itertools

import pytest
import torch

from cdlm.networks.transformer import Transformer
from cdlm.processes.duality import DualSchedule
from cdlm.processes.uniform import UniformProcess
from cdlm.samplers import uniform_grid
from cdlm.samplers.uniform import sample_duo_ancestral
from cdlm.schedules import CosineSchedule

V, B, L = 11, 4, 12


def tiny(process):
    torch.manual_seed(0)
    network = Transformer(
        **process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=L
    )
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return network.eval()


def canvas(process, strength: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, L), generator=g)
    editable = torch.zeros(B, L, dtype=torch.bool)
    editable[:, 3:9] = True
    seeded = editable.clone()
    x = process.prior((B, L), torch.device("cpu"), g)
    return ids, editable, seeded, process.start(x, ids, editable, seeded, strength, g)


def test_infilling_never_moves_a_fixed_token():
    process = UniformProcess(vocab_size=V)
    ids, editable, seeded, x = canvas(process, 1.0)
    assert torch.equal(x[~editable], ids[~editable])
    denoiser = process.conditioned_denoiser(tiny(process), fixed=None)
    held = process.hold_fixed(denoiser, ids, editable, None)
    seen = []
    out = sample_duo_ancestral(
        held, x, uniform_grid(8), process=process, generator=torch.Generator().manual_seed(1),
        callback=seen.append,
    )  # fmt: skip
    assert len(seen) == 8 and out.nfe == 8
    for step in seen:
        assert torch.equal(step.x[~editable], ids[~editable])
    assert out.stats["revisions"] > 0  # the editable positions did move


def test_editing_starts_from_the_noised_text():
    process = UniformProcess(vocab_size=V)
    ids, editable, _, x = canvas(process, 0.05)  # keep(0.05) ~ 0.95
    kept = (x == ids)[editable].double().mean()
    assert 0.85 < float(kept) <= 1.0
    _, _, _, fresh = canvas(process, 1.0)
    assert float((fresh == ids)[editable].double().mean()) < 0.5


def test_refusals():
    process = UniformProcess(vocab_size=V)
    with pytest.raises(ValueError, match="cannot score hidden tokens"):
        process.score_hidden(None, torch.zeros(1, L, dtype=torch.long), torch.ones(1, L).bool())
    with pytest.raises(ValueError, match="alpha"):
        UniformProcess(vocab_size=V, schedule=CosineSchedule())


def test_the_dual_schedule_drives_the_process():
    """The Gaussian-induced alpha(t) plugs in as the process's schedule; its loss is finite."""
    process = UniformProcess(vocab_size=V, schedule=DualSchedule(CosineSchedule(-4.0, 4.0), V))
    tokens = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(2))
    loss = process.eval().loss(
        process.make_denoiser(tiny(process)), {"tokens": tokens}, torch.Generator().manual_seed(3)
    )
    assert torch.isfinite(loss.loss) and float(loss.loss) > 0


def test_the_bound_is_exact_for_the_exact_reverse_process():
    """With x0_hat at position l the posterior of x0_l given every *other* position of x_t (the
    x0 estimate whose x_bar ratios are the exact reverse rates of uniform noise), the ELBO over
    alpha from 1 to 0 is -log p(x) for every sequence of a known joint, by quadrature in t.
    (The ordinary marginal p(x0_l | x_t) does not give equality: it counts the position's own
    observation twice.)"""
    from scipy import integrate

    from cdlm.processes.uniform import uniform_nelbo

    vocab, length, f64 = 3, 2, torch.float64
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(len(seqs), generator=g, dtype=f64), 0)
    zs = seqs  # every corruption

    def q(a: float, x: torch.Tensor, at: list[int]) -> torch.Tensor:
        return (a * (zs[:, at] == x[at]) + (1 - a) / vocab).prod(-1)  # (Z,)

    def leave_one_out(a: float) -> torch.Tensor:  # (Z, L, V) log p(x0_l = v | z without l)
        out = []
        for pos in range(length):
            others = [m for m in range(length) if m != pos]
            post = torch.stack([q(a, s, others) for s in seqs], 1) * p
            onehot = torch.nn.functional.one_hot(seqs[:, pos], vocab).double()
            out.append((post / post.sum(1, keepdim=True)) @ onehot)
        return torch.stack(out, 1).clamp_min(1e-300).log()

    def integrand(t: float, x: torch.Tensor) -> float:
        a, n = 1.0 - t, len(zs)
        per = uniform_nelbo(
            leave_one_out(a), zs, x.expand_as(zs), torch.full((n,), a, dtype=f64),
            torch.full((n,), -1.0, dtype=f64),
        ).sum(-1)  # fmt: skip
        return float((q(a, x, list(range(length))) * per).sum())

    for x, px in zip(seqs[::4], p[::4], strict=True):  # three of the nine, for time
        bound = integrate.quad(integrand, 0, 1, args=(x,), epsabs=1e-10, epsrel=1e-8, limit=200)
        assert bound[0] == pytest.approx(float(-px.log()), rel=1e-7)
