"""Slow, obvious references for the process contract (``tests/test_process_contract.py``).

Tiny processes are built from conf/process/ the way ``cdlm-train`` builds them (Hydra compose,
``token_ids`` from a tokenizer, ``instantiate``), and each loss or bound is recomputed by
enumeration and quadrature in float64: every sequence (AR), every mask pattern (masked, block),
a one-dimensional integral over t with the expectation over the noise in closed form (gaussian).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from scipy import integrate
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import Tensor, nn

from cdlm.configs import compose
from cdlm.data.tokenizer import wrap
from cdlm.processes.vocabulary import token_ids
from cdlm.run.build import model_config

WORDS = ["<pad>", "<eos>", "<mask>", "a", "b", "c"]  # EOS (= BOS) 1, [MASK] 2
V, L = len(WORDS), 4
DATA_IDS = [0, 1, 3, 4, 5]  # what ``words`` draws: every id but [MASK]
F64 = torch.float64
TINY = [
    "network.d_model=8",
    "network.n_layers=1",
    "network.n_heads=2",
    f"data.seq_len={L}",
]  # a row's own overrides size its process (the gaussian embedding width)


@dataclass
class Parts:
    """What a checkpoint holds: the process and network (float32, eval mode) and the configs
    that rebuild them."""

    process: nn.Module
    network: nn.Module
    tokenizer: Any
    config: dict


def tokenizer():
    """A word-level tokenizer over ``WORDS`` with cdlm's special tokens."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return wrap(tok.to_str())


def build(name: str, overrides: list[str]) -> Parts:
    """conf/process/<name>.yaml at toy size, built as ``cdlm.run.build`` builds it; the network's
    weights are nudged off adaLN-Zero's identity start, so every input reaches the output."""
    cfg = compose("train", [f"process={name}", *TINY, *overrides])
    tok = tokenizer()
    held = [i for i in DATA_IDS if i in tok.all_special_ids]  # the data's specials, as
    process_kwargs = token_ids(cfg.process, tok, held)  # a data module reports them
    torch.manual_seed(0)  # the gaussian embedding table and the network's weights
    process = instantiate(cfg.process, **process_kwargs)
    network_kwargs = process.network_kwargs | {"max_seq_len": L + 1, "num_classes": 0}
    network = instantiate(cfg.network, **network_kwargs)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.3 * torch.randn_like(p))
    config = model_config(cfg, process_kwargs, network_kwargs, [])
    return Parts(process.eval(), network.eval(), tok, config)


def zeros(n: int) -> Tensor:
    return torch.zeros(n, dtype=F64)


# --- autoregressive: the chain rule, one prefix at a time ---------------------------------------


def all_sequences(vocab: list[int], length: int) -> Tensor:
    """(len(vocab)^length, length) every sequence over ``vocab``."""
    return torch.tensor(list(itertools.product(vocab, repeat=length)))


def ar_log_prob(network: nn.Module, bos: int, seqs: Tensor) -> Tensor:
    """(N,) log p(seq) = sum_i log p(x_i | BOS, x_<i), each factor from a call on the prefix
    alone (so nothing to the right can leak in)."""
    total = zeros(len(seqs))
    for i in range(seqs.shape[1]):
        inputs = torch.cat([torch.full_like(seqs[:, :1], bos), seqs[:, :i]], 1)
        logp = network(inputs, zeros(len(seqs)))[:, -1].double().log_softmax(-1)
        total += logp.gather(-1, seqs[:, i, None]).squeeze(-1)
    return total


def check_autoregressive(process: nn.Module, network: nn.Module) -> None:
    """The eval loss is the exact NLL by the chain rule over prefix-only calls, and the model's
    probabilities of all V^L sequences sum to 1."""
    seqs = all_sequences(list(range(V)), L)
    logp = ar_log_prob(network, process.canvas_id, seqs)
    assert float(logp.logsumexp(0)) == pytest.approx(0.0, abs=1e-12)
    loss = process.loss(process.make_denoiser(network), {"tokens": seqs}).loss
    assert float(loss) == pytest.approx(float(-logp.mean() / L), rel=1e-12)


# --- masked and block: every mask pattern, a quadrature over t per number of masks -------------


def patterns(n: int) -> Tensor:
    """(2^n, n) bool: every mask pattern of n positions."""
    return torch.tensor(list(itertools.product([False, True], repeat=n)))


def level_weights(keep, n: int, t_lo: float, t_hi: float) -> Tensor:
    """(n + 1,) int w(t) keep^(n-m) (1-keep)^m dt over [t_lo, t_hi] for m = 0..n masks of n,
    w = -keep'/(1 - keep) (MDLM eq. 10), keep' by central differences: the t-weight of every
    pattern with m masked positions (none for m = 0: nothing is scored)."""
    h = 1e-6

    def f(t: float, m: int) -> float:
        k = keep(t)
        dk = (keep(t + h) - keep(t - h)) / (2 * h)
        return -dk * k ** (n - m) * (1 - k) ** (m - 1)

    opts = {"epsabs": 1e-13, "epsrel": 1e-12, "limit": 200}
    return torch.tensor(
        [0.0] + [integrate.quad(f, t_lo, t_hi, args=(m,), **opts)[0] for m in range(1, n + 1)],
        dtype=F64,
    )


def pattern_bound(ce: Tensor, masked: Tensor, weights: Tensor) -> Tensor:
    """(N,) sum over patterns of int w(t) P(pattern | t) dt * ce; ``ce`` (N, P) the masked
    positions' summed CE under each pattern of ``masked`` (P, n); ``weights`` from
    ``level_weights``."""
    return (ce * weights[masked.sum(-1)]).sum(-1)


def keep_of(schedule: nn.Module):
    return lambda t: float(schedule.keep(torch.tensor(t, dtype=F64)))


def subs_log_probs(network: nn.Module, z: Tensor, mask_id: int, bos: int | None) -> Tensor:
    """(B, L, V) the masked model's log-probabilities by hand: none on [MASK]; shifted, position
    i read from output i of [BOS, z] (the last output dropped)."""
    if bos is not None:
        out = network(torch.cat([torch.full_like(z[:, :1], bos), z], 1), zeros(len(z)))[:, :-1]
    else:
        out = network(z, zeros(len(z)))
    out = out.double().clone()
    out[..., mask_id] = -math.inf
    return out.log_softmax(-1)


def masked_bound(network, xs: Tensor, mask_id: int, bos, weights: Tensor) -> Tensor:
    """(N,) the masked ELBO of each sequence of ``xs`` (N, L), nats, over the levels that
    ``weights`` integrates."""
    masked = patterns(xs.shape[1])  # (P, L)
    z = torch.where(masked[None], mask_id, xs[:, None]).flatten(0, 1)
    logp = subs_log_probs(network, z, mask_id, bos).view(len(xs), len(masked), xs.shape[1], V)
    token = logp.gather(-1, xs[:, None, :, None].expand(-1, len(masked), -1, 1)).squeeze(-1)
    return pattern_bound(-(token * masked).sum(-1), masked, weights)


def block_bound(denoiser, xs: Tensor, mask_id: int, size: int, weights: Tensor) -> Tensor:
    """(N,) the block ELBO of each sequence of ``xs`` (N, L), nats: per block, every pattern
    inside it given the clean blocks before it and nothing after (masked), each prediction
    from the sampler's window call."""
    masked, (n, length) = patterns(size), xs.shape
    total = torch.zeros(n, dtype=F64)
    for a in range(0, length, size):
        z = torch.full((n, len(masked), length), mask_id)
        z[..., :a] = xs[:, None, :a]
        z[..., a : a + size] = torch.where(masked, mask_id, xs[:, None, a : a + size])
        positions = torch.arange(a, a + size)
        logp = denoiser(z.flatten(0, 1), zeros(len(masked) * n), positions=positions).logits
        logp = logp.double().view(n, len(masked), size, V)
        target = xs[:, None, a : a + size, None].expand(-1, len(masked), -1, 1)
        token = logp.gather(-1, target).squeeze(-1)
        total += pattern_bound(-(token * masked).sum(-1), masked, weights)
    return total


def window_ce(denoiser, x: Tensor, z: Tensor, mask_id: int, size: int) -> Tensor:
    """(P, L) -log p(x_l) at the masked positions of each canvas of ``z`` (P, L), 0 elsewhere;
    each block from the sampler's window call given the clean blocks of ``x`` before it."""
    out = torch.zeros(z.shape, dtype=F64)
    for a in range(0, len(x), size):
        window = torch.where(torch.arange(len(x)) < a, x, z)
        window[:, a + size :] = mask_id
        positions = torch.arange(a, a + size)
        logp = denoiser(window, zeros(len(z)), positions=positions).logits.double()
        token = logp.gather(-1, x[positions].expand(len(z), size)[..., None]).squeeze(-1)
        out[:, positions] = -token
    return out * (z == mask_id)


def known_joint(seed: int) -> tuple[Tensor, Tensor]:
    """Every sequence without [MASK] (S, L) and a random joint over them (S,), float64."""
    seqs = all_sequences([0, 1, 3, 4, 5], L)
    return seqs, torch.softmax(2 * torch.randn(len(seqs), generator=gen(seed), dtype=F64), 0)


class Oracle(nn.Module):
    """A network whose outputs are the exact conditional marginals of a known joint ``p`` over
    ``seqs`` (S, L): at position i, log p(x_i | the canvas's unmasked tokens). ``bos``: the
    shifted layout ([BOS, z] in, output i predicting z_i, one spare output at the end)."""

    def __init__(self, seqs: Tensor, p: Tensor, mask_id: int, bos: int | None) -> None:
        super().__init__()
        self.seqs, self.p, self.mask_id, self.bos = seqs, p, mask_id, bos

    def forward(self, x: Tensor, t: Tensor, *args, **kwargs) -> Tensor:
        canvas = x[:, 1:] if self.bos is not None else x
        seen = canvas != self.mask_id
        fits = ((self.seqs[None] == canvas[:, None]) | ~seen[:, None]).all(-1)  # (B, S)
        onehot = nn.functional.one_hot(self.seqs, V).to(F64)  # (S, L, V)
        out = torch.einsum("bs,slv->blv", fits * self.p, onehot).log()
        return out if self.bos is None else torch.cat([out, torch.zeros_like(out[:, :1])], 1)


# --- gaussian: the VDM bound of a linear denoiser, expectations over the noise in closed form ---


def vdm_linear_bound(process: nn.Module, tokens: Tensor) -> dict[str, float]:
    """The VDM terms (nats) of one sequence ``tokens`` (L,) under x0_hat(x_t, t) = alpha(t) x_t
    (the posterior mean of x0 ~ N(0, I)), for which E_eps |e - x0_hat|^2 = sigma^4 |e|^2 +
    alpha^2 sigma^2 L D. diffusion = -1/2 int_0^1 SNR'(t) E|e - x0_hat|^2 dt by quadrature in t
    (SNR' by autograd); prior = KL(q(x_1 | e) || N(0, I)); reconstruction =
    E_{x_0 ~ q(x_0 | e)} -log p(w | x_0) under the embedding decoder, by Gauss-Hermite."""
    e = process.embedding(tokens[None])[0].detach().double()  # (L, D)
    sq, n = float(e.pow(2).sum()), e.numel()
    s = process.schedule

    def a2(t: float) -> float:
        return float(s.alpha(torch.tensor(t, dtype=F64)) ** 2)

    def f(t: float) -> float:
        tt = torch.tensor(t, dtype=F64, requires_grad=True)
        snr = s.alpha(tt) ** 2 / s.sigma(tt) ** 2
        (dsnr,) = torch.autograd.grad(snr, tt)  # SNR'(t) through the schedule, exactly
        sig2 = 1 - a2(t)
        return -0.5 * float(dsnr) * (sig2**2 * sq + a2(t) * sig2 * n)

    diffusion = integrate.quad(f, 0.0, 1.0, epsabs=1e-12, epsrel=1e-11, limit=500)[0]
    a1, s1 = math.sqrt(a2(1.0)), math.sqrt(1 - a2(1.0))
    q1 = torch.distributions.Normal(a1 * e, torch.full_like(e, s1))
    prior = float(torch.distributions.kl_divergence(q1, torch.distributions.Normal(0.0, 1.0)).sum())
    return {"prior": prior, "diffusion": diffusion, "reconstruction": rounding(process, tokens)}


def rounding(process: nn.Module, tokens: Tensor, points: int = 10) -> float:
    """sum_l E_{x ~ N(alpha_0 e_l, sigma_0^2 I)} -log softmax(alpha_0 / sigma_0^2 x . E)[w_l],
    by a Gauss-Hermite rule in D dimensions."""
    table = process.embedding.table().detach().double()
    a0 = float(process.schedule.alpha(torch.zeros((), dtype=F64)))
    s0 = math.sqrt(1 - a0**2)
    nodes, weights = np.polynomial.hermite_e.hermegauss(points)  # for N(0, 1)
    grid = torch.tensor(list(itertools.product(nodes, repeat=table.shape[1])))
    w = torch.tensor([math.prod(c) for c in itertools.product(weights, repeat=table.shape[1])])
    w = w / w.sum()
    total = 0.0
    for token in tokens.tolist():
        x = a0 * table[token] + s0 * grid  # (G, D)
        logp = ((a0 / s0**2) * x @ table.T).log_softmax(-1)[:, token]
        total -= float((w * logp).sum())
    return total


# --- shared by the contract's checks ---------------------------------------------------------


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def words(n: int, seed: int) -> Tensor:
    """(n, L) token ids without the [MASK] token."""
    return torch.tensor(DATA_IDS)[torch.randint(0, len(DATA_IDS), (n, L), generator=gen(seed))]


def monte_carlo(process, denoiser, xs: Tensor, rows: int = 1024, draws: int = 16):
    """(mean, standard error) of the eval-mode loss over ``draws`` batches of ``xs`` repeated."""
    batch = {"tokens": xs.repeat(rows // len(xs), 1)}
    losses = torch.stack([process.loss(denoiser, batch, gen(s)).loss for s in range(draws)])
    return float(losses.mean()), float(losses.std() / math.sqrt(draws))


def weight_by_hand(process, t: float) -> float:
    keep, h = keep_of(process.schedule), 1e-6
    return -(keep(t + h) - keep(t - h)) / (2 * h) / (1 - keep(t))
