"""The exact denoiser of uniform-state noise (``process=uniform``; UDLM, Duo) on a world.

Uniform noise keeps each token with probability alpha_t and otherwise redraws it from the K ids
of its support (``cdlm.processes.uniform_support``: the world's tokens, or all V), so a noisy
token x_t^j is evidence q(x_t^j | x0^j = v) = alpha_t [v = x_t^j] + (1 - alpha_t) / K about
x0^j: never an observation of it (the masked oracle's reading). The world's forward-backward
over that evidence gives the posterior p(x0^i | x_t); the ids outside the support, which the
world never emits, get none.

What the network must output is not that posterior but the leave-one-out posterior
p(x0^i | x_t^{-i}) (the evidence of every position but i), by two routes that agree:

- The ELBO (Duo eq. 11; UDLM) scores x_bar_theta = K alpha x0_hat + 1 - alpha only through
  the ratios x_bar_theta_j / x_bar_theta_i, which stand for the true reverse-rate ratios
  p_t(x^{i -> j}) / p_t(x). Marginalising x0^i given the other positions' tokens, that ratio is
  sum_v p(x0^i = v | x_t^{-i}) q(j | v) / sum_v p(x0^i = v | x_t^{-i}) q(x_t^i | v), which is
  x_bar_theta_j / x_bar_theta_i exactly when x0_hat = p(x0^i | x_t^{-i}); x_bar_theta sums to
  K, so the minimiser is unique.
- The plug-in step q(x_s | x_t, x0_hat) (``cdlm.samplers.uniform.uniform_posterior``) is
  proportional to q(x_t^i | x_s^i) sum_v q(x_s^i | v) x0_hat(v), while the exact per-token
  marginal is sum_v q(x_s^i | x_t^i, v) p(x0^i = v | x_t), and
  p(x0^i = v | x_t) = q(x_t^i | v) p(x0^i = v | x_t^{-i}) / Z: the two agree for every s
  exactly when x0_hat is the leave-one-out posterior. At s = 0 the step draws from the full
  posterior p(x0^i | x_t); the argmax of x0_hat (a greedy last step) ignores x_t^i's own
  evidence.

``tests/test_uniform_oracle.py`` checks both by enumeration in float64: the step against the
exact marginal, and the ELBO with this x0_hat integrated over t, which equals the world's
entropy (to 1e-5 nats; the full posterior in its place is 1.1 nats above on a tiny world). The leave-one-out
posterior is the full one with each position's own evidence divided out: for a chain that is
the forward message into i times the backward message out of i, which is what the division
leaves.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cdlm.schedules import MaskSchedule
from cdlm.worlds.base import NEVER, World
from cdlm.worlds.oracle import OracleNetwork


def uniform_evidence(x_t: Tensor, keep: Tensor, vocab: int, states: int | None = None) -> Tensor:
    """(B, L, V) log q(x_t | x0 = v) = log(alpha [v = x_t] + (1 - alpha) / K), float64.

    x_t: (B, L) ids; keep: alpha_t, (B,) or per token (B, L); states: the K ids the noise draws
    from (None: all ``vocab``). Off the support q(x_t | x0 = v) has no meaning (no clean token
    is there); it gets the same off-token value, which the world's zero prior there cancels."""
    a, states = keep.double(), vocab if states is None else states
    a = (a[:, None] if a.dim() == 1 else a)[..., None].expand(*x_t.shape, 1)
    ev = ((1 - a) / states).expand(*x_t.shape, vocab).clone()
    ev.scatter_add_(-1, x_t[..., None], a)
    return ev.log()


class UniformOracleNetwork(OracleNetwork):
    """The leave-one-out posterior p(x0^i | x_t^{-i}) of ``world`` under uniform noise at the
    level of ``schedule`` the network is called with (module docstring), as log-probabilities.

    Args:
        world, out_dim, in_vocab, self_condition, max_seq_len, num_classes: as
            ``OracleNetwork``.
        schedule: alpha(t) of the uniform process (its ``uniform_noise.schedule``).
        states: the K ids its noise draws from (its ``uniform_noise.support.size``); None: all
            of the world's vocabulary.
        causal, shift, mask_id: must be the uniform process's (bidirectional, unshifted, no
            mask).
    """

    def __init__(
        self, world: World, schedule: MaskSchedule, states: int | None = None, **kwargs
    ) -> None:
        if kwargs.get("causal") or kwargs.get("shift") or kwargs.get("mask_id") is not None:
            raise ValueError("a uniform oracle reads every position unshifted, with no [MASK]")
        super().__init__(world, **kwargs)
        self.schedule, self.states = schedule, states

    def forward(
        self,
        x: Tensor,
        t: Tensor | None = None,
        self_cond: Tensor | None = None,
        cache=None,
        label: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        **ignored,
    ) -> Tensor:
        """(B, L, V) log p(x0^i | x_t^{-i}) for ids ``x`` (B, L) at levels t (B,); NEVER where
        the world puts no mass. Refuses what a uniform model is never called with."""
        if t is None or x.is_floating_point():
            raise ValueError("a uniform oracle reads token ids at a noise level t")
        if cache is not None or attn_mask is not None:
            raise ValueError("a uniform oracle reads the whole canvas: no cache or attention mask")
        if positions is not None and not torch.equal(positions.cpu(), torch.arange(x.shape[1])):
            raise ValueError("a uniform oracle reads the whole canvas from position 0")
        if label is not None and bool((label >= 0).any()):
            raise ValueError("a world has no class labels")
        t = t.expand(x.shape[0]) if t.dim() == 0 else t
        keep = self.schedule.keep(t.double())
        evidence = uniform_evidence(x, keep, self.world.vocab_size, self.states)
        posterior = self.world.posterior(evidence).double()
        loo = (posterior - evidence.to(posterior.device)).log_softmax(-1)
        return loo.clamp_min(NEVER).float()
