"""The continuous sampler suite against closed forms, plus the contract every gaussian sampler
passes.

Gaussian data N(mu, Sigma) in embedding space has an exact denoiser,
E[x0 | x_t] = mu + alpha Sigma (alpha^2 Sigma + sigma^2 I)^-1 (x_t - alpha mu), and an exact
probability-flow map, x_t - alpha_t mu = C_t^1/2 C_1^-1/2 (x_1 - alpha_1 mu) with
C_t = alpha_t^2 Sigma + sigma_t^2 I (both sides solve the ODE, since all C_t commute).
"""

import functools
import math

import pytest
import torch

from cdlm.denoiser import Prediction
from cdlm.processes.gaussian import GaussianProcess
from cdlm.samplers import (
    SAMPLERS,
    make_grid,
    sample_adaptive,
    sample_consistency,
    sample_ddim,
    sample_ddpm,
    sample_dpmpp_2m,
    sample_euler,
    sample_euler_maruyama,
    sample_heun,
    sample_rolling,
)
from cdlm.schedules import CosineSchedule

F64 = torch.float64
ALL_GAUSSIAN = [
    sample_ddpm,
    sample_ddim,
    sample_euler,
    sample_heun,
    sample_dpmpp_2m,
    sample_euler_maruyama,
    sample_adaptive,
    sample_rolling,
    sample_consistency,
]


class GaussianData:
    """N(mu, Sigma) in D dims with a rotated (non-diagonal) covariance, and its exact denoiser."""

    def __init__(self, eigenvalues=(0.05, 0.5, 2.0), logsnr_min=-20.0, logsnr_max=10.0):
        g = torch.Generator().manual_seed(0)
        d = len(eigenvalues)
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
        self.cov = q @ torch.diag(torch.tensor(eigenvalues, dtype=F64)) @ q.T
        self.mu = torch.linspace(-1.0, 0.6, d, dtype=F64)
        self.d, self.calls = d, 0
        # logsnr_min = -20 makes the N(0, I) prior exact to ~1e-5, so what is left is the solver
        self.schedule = CosineSchedule(logsnr_min, logsnr_max).double()

    def coef(self, t) -> tuple:
        t = torch.as_tensor(t, dtype=F64)
        return self.schedule.alpha(t), self.schedule.sigma(t)

    def marginal_cov(self, t):
        a, s = self.coef(t)
        return a**2 * self.cov + s**2 * torch.eye(self.d, dtype=F64)

    def __call__(self, x, t, self_cond=None):
        self.calls += 1
        if t.dim() == 2:  # one level per position (rolling grid): positions are independent
            x0 = torch.stack([self.posterior_mean(x[:, i], t[0, i]) for i in range(x.shape[1])], 1)
        else:
            x0 = self.posterior_mean(x, t[0])
        return Prediction(x0=x0, logits=torch.zeros(*x.shape[:-1], 4, dtype=x.dtype))

    def posterior_mean(self, x, t):
        a, _ = self.coef(t)
        gain = a * self.cov @ torch.linalg.inv(self.marginal_cov(t))
        return self.mu + (x - a * self.mu) @ gain.T

    def exact_flow(self, x1, t):
        """The probability-flow ODE solution at time t from x1 at t = 1."""

        def power(m, p):
            w, v = torch.linalg.eigh(m)
            return v @ torch.diag(w**p) @ v.T

        m = power(self.marginal_cov(t), 0.5) @ power(self.marginal_cov(1.0), -0.5)
        a_t, _ = self.coef(t)
        a_1, _ = self.coef(1.0)
        return a_t * self.mu + (x1 - a_1 * self.mu) @ m.T

    def process(self):
        """A GaussianProcess used for its schedule only."""
        process = GaussianProcess(vocab_size=4, embed_dim=self.d, schedule=self.schedule)
        return process.double()


def whitened_prior(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """(n, 1, d) draws whose sample mean is exactly 0 and sample covariance exactly I, so that
    deterministic samplers are checked without Monte Carlo error."""
    z = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)
    z = z - z.mean(0)
    w, v = torch.linalg.eigh(torch.cov(z.T))
    return (z @ v @ torch.diag(w**-0.5) @ v.T)[:, None]


def moments(x):
    return x[:, 0].mean(0), torch.cov(x[:, 0].T)


@pytest.mark.parametrize(
    "sampler, steps, grid, kwargs",
    [
        (sample_euler, 1024, "logsnr", {}),
        (sample_heun, 128, "logsnr", {}),
        (sample_dpmpp_2m, 64, "logsnr", {}),
        (sample_ddim, 1024, "logsnr", {}),
        (sample_adaptive, 1, "uniform", {"rtol": 1e-7, "atol": 1e-7}),
    ],
)
def test_ode_samplers_carry_the_prior_to_the_data_moments(sampler, steps, grid, kwargs):
    data = GaussianData()
    x1 = whitened_prior(2048, data.d)
    out = sampler(data, x1, make_grid(grid, steps, data.schedule), process=data.process(), **kwargs)
    mean, cov = moments(out.x)
    torch.testing.assert_close(mean, data.mu, atol=2e-3, rtol=0)
    torch.testing.assert_close(cov, data.cov, atol=1e-2, rtol=0)


@pytest.mark.parametrize(
    "sampler",
    [sample_ddpm] + [functools.partial(sample_euler_maruyama, churn=c) for c in (1.0, 1.5)],
    ids=["ddpm", "churn1", "churn1.5"],
)
def test_sde_samplers_match_the_data_in_distribution(sampler):
    """Monte Carlo: 20000 draws give standard errors <= sqrt(8 / 20000) = 0.02 on Sigma's entries
    (largest eigenvalue 2) and <= 0.01 on the mean; tolerances are ~4 standard errors. Churn < 1
    is left out: on this 200-step uniform grid its first-order error is larger than that (the
    covariance is off by 10 at churn 0, 1.9 at 0.5), halving as the steps double."""
    data = GaussianData(logsnr_min=-12.0)
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(20000, 1, data.d, generator=g, dtype=F64)
    out = sampler(
        data, x1, make_grid("uniform", 200, data.schedule), process=data.process(), generator=g
    )
    mean, cov = moments(out.x)
    torch.testing.assert_close(mean, data.mu, atol=0.04, rtol=0)
    torch.testing.assert_close(cov, data.cov, atol=0.08, rtol=0)


@pytest.mark.parametrize(
    "sampler, order", [(sample_euler, 1.0), (sample_heun, 2.0), (sample_dpmpp_2m, 2.0)]
)
def test_empirical_convergence_order(sampler, order):
    """Error of the last ODE state (at the last positive grid time) against the exact flow from
    the same prior draw, on log-SNR grids of 16..128 steps: each doubling divides it by ~2^order.
    The exact flow is the limit of any fine reference solve, without its own error."""
    data = GaussianData()
    process = data.process()
    x1 = torch.randn(64, 1, data.d, generator=torch.Generator().manual_seed(3), dtype=F64)
    errors = []
    for steps in (16, 32, 64, 128):
        states = []
        grid = make_grid("logsnr", steps, data.schedule)
        sampler(data, x1, grid, process=process, callback=states.append)
        last = states[-2]
        errors.append((last.x - data.exact_flow(x1, last.s)).abs().max().item())
    orders = [math.log2(errors[i] / errors[i + 1]) for i in range(len(errors) - 1)]
    assert abs(orders[-1] - order) < 0.15, orders
    assert all(o > order - 0.4 for o in orders[1:]), orders


def test_every_registered_gaussian_sampler_is_in_the_contract_suite():
    """Every gaussian sampler but ``hybrid``, which reveals tokens of a model trained with
    ``process.hybrid`` and has no Gaussian-data contract (tests/test_hybrid.py checks it)."""
    names = {fn.sampler_name for fn in ALL_GAUSSIAN}
    assert names == {n for n, kinds in SAMPLERS.items() if "gaussian" in kinds} - {"hybrid"}


def expected_nfe(sampler, steps, calls):
    if sampler is sample_heun:
        return 2 * steps - 1
    if sampler is sample_adaptive:
        return calls  # chosen by the error control; must still equal the calls made
    return steps


@pytest.mark.parametrize("sampler", ALL_GAUSSIAN)
@pytest.mark.parametrize("steps", [1, 5])
def test_sampler_contract(sampler, steps):
    """Shapes, NFE = network calls, one callback per grid interval ending at t = 0, and the same
    result for the same seed."""
    data = GaussianData()
    process = data.process()
    runs = []
    for _ in range(2):
        data.calls, seen = 0, []
        g = torch.Generator().manual_seed(7)
        x = torch.randn(2, 5, data.d, generator=g, dtype=F64)
        grid = make_grid("uniform", steps, data.schedule)
        out = sampler(data, x, grid, process=process, generator=g, callback=seen.append)
        assert out.x.shape == (2, 5, data.d) and out.tokens.shape == (2, 5)
        assert out.nfe == data.calls == expected_nfe(sampler, steps, data.calls)
        assert [s.i for s in seen] == list(range(steps))
        assert seen[0].t == 1.0 and seen[-1].s == 0.0 and seen[-1].x is out.x
        runs.append(out.x)
    torch.testing.assert_close(runs[0], runs[1], atol=0, rtol=0)


def test_euler_is_ddim_and_options_are_checked():
    data = GaussianData()
    process, x = data.process(), whitened_prior(16, data.d)
    grid = make_grid("karras", 9, data.schedule)
    euler = sample_euler(data, x, grid, process=process)
    torch.testing.assert_close(euler.x, sample_ddim(data, x, grid, process=process).x)
    with pytest.raises(ValueError, match="churn"):
        sample_euler_maruyama(data, x, grid, process=process, churn=-1.0)
    with pytest.raises(ValueError, match="RK45"):
        functools.partial(sample_adaptive, method="Euler")(data, x, grid, process=process)
