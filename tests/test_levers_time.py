"""Learning-efficiency levers over noise levels (docs/guide/levers.md): bell-shaped and clipped training
times, the curriculum over a shaped base, and importance weights that keep the bound unbiased."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.integrate import quad
from scipy.stats import truncnorm

from cdlm.denoiser import Prediction
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.uniform import UniformProcess
from cdlm.schedules import CosineMaskSchedule
from cdlm.time_samplers import Bell, Clipped, Curriculum, TimeSampler

CPU = torch.device("cpu")


def integral(density, points=()) -> float:
    return quad(lambda t: float(density(torch.tensor([t]))), 0, 1, points=points, limit=200)[0]


def test_bell_is_the_truncated_normal_drawn_one_per_stratum():
    bell = Bell(mean=0.3, std=0.25)
    truth = truncnorm((0 - 0.3) / 0.25, (1 - 0.3) / 0.25, loc=0.3, scale=0.25)
    grid = torch.linspace(0, 1, 41, dtype=torch.float64)
    torch.testing.assert_close(bell.density(grid), torch.from_numpy(truth.pdf(grid.numpy())))
    assert integral(bell.density) == pytest.approx(1.0, abs=1e-6)
    n = 1000
    t = bell(n, CPU, torch.Generator().manual_seed(0)).double()
    assert 0 <= t.min() and t.max() <= 1
    # inverse-CDF of stratified uniforms: exactly one draw in each of n equal-probability cells
    cells = torch.from_numpy(truth.cdf(t.numpy())) * n
    assert sorted(cells.floor().long().clamp_max(n - 1).tolist()) == list(range(n))
    with pytest.raises(ValueError, match="bell std must be > 0"):
        Bell(std=0.0)
    with pytest.raises(ValueError, match="bell mean must be a level in"):
        Bell(mean=1.5)


def test_clipped_draws_one_time_per_stratum_of_its_interval_and_nothing_outside():
    clipped = Clipped(low=0.3, high=0.8)
    t = clipped(50, CPU, torch.Generator().manual_seed(1))
    assert sorted(((t - 0.3) / 0.5 * 50).floor().long().tolist()) == list(range(50))
    grid = torch.tensor([0.0, 0.29, 0.3, 0.55, 0.8, 0.81, 1.0])
    torch.testing.assert_close(clipped.density(grid), torch.tensor([0, 0, 2, 2, 2, 0, 0.0]))
    assert integral(clipped.density, points=(0.3, 0.8)) == pytest.approx(1.0)
    assert not clipped.covers_all_levels and Clipped(0.0, 1.0).covers_all_levels
    with pytest.raises(ValueError, match="0 <= low < high <= 1"):
        Clipped(low=0.8, high=0.3)


@pytest.mark.parametrize("make", [MaskedProcess, UniformProcess])
def test_importance_weights_are_refused_where_no_weight_restores_the_bound(make):
    kwargs = {"mask_id": 9} if make is MaskedProcess else {}
    with pytest.raises(ValueError, match="Clipped leaves some out"):
        make(10, time_sampler=Clipped(), importance_weight=True, **kwargs)
    make(10, time_sampler=Clipped(), **kwargs)  # clipped training alone is BD3-LM's recipe
    with pytest.raises(ValueError, match="do not combine"):
        make(10, importance_weight=True, complementary=True, **kwargs)


def test_curriculum_shapes_its_range_with_a_base_proposal():
    curriculum = Curriculum(start=0.2, ramp=0.5, base=Bell(mean=0.5, std=0.2))
    g = torch.Generator().manual_seed(2)
    draw = curriculum(64, CPU, torch.Generator().manual_seed(2))
    torch.testing.assert_close(draw, 0.2 * Bell(0.5, 0.2)(64, CPU, g))  # hi times the base draw
    # its density is the range's now, exactly: base density(t / hi) / hi, nothing above hi
    assert integral(curriculum.density, points=(0.2,)) == pytest.approx(1.0, abs=1e-6)
    assert float(curriculum.density(torch.tensor([0.25]))) == 0.0
    torch.testing.assert_close(
        curriculum.density(torch.tensor([0.1])), Bell(0.5, 0.2).density(torch.tensor([0.5])) / 0.2
    )
    curriculum.set_progress(0.5)  # the end of the ramp: the base proposal itself
    grid = torch.linspace(0, 1, 11)
    torch.testing.assert_close(curriculum.density(grid), Bell(0.5, 0.2).density(grid))
    assert not Curriculum(base=Clipped()).covers_all_levels
    # the plain curriculum's density is 1 / hi on its range (it used to claim 1 everywhere)
    plain = Curriculum(start=0.25, ramp=0.5)
    torch.testing.assert_close(plain.density(torch.tensor([0.1, 0.3])), torch.tensor([4.0, 0.0]))


class UniformLogits:
    """A denoiser uniform over the V - 1 tokens that are not [MASK] (as SUBS puts none there):
    log(V - 1) nats per masked token."""

    def __call__(self, z, t, *args, **kwargs):
        logits = torch.zeros(*z.shape, V)
        logits[..., MASK] = -math.inf
        return Prediction(logits=logits.log_softmax(-1))


V, MASK = 8, 7


def masked_losses(importance_weight: bool, batches: int) -> torch.Tensor:
    """Training losses of a cosine-schedule masked process under a bell proposal, (batches,)."""
    process = MaskedProcess(
        V,
        mask_id=MASK,
        schedule=CosineMaskSchedule(eps=0.0),
        time_sampler=Bell(mean=0.6, std=0.25),
        importance_weight=importance_weight,
    ).train()
    g = torch.Generator().manual_seed(3)
    tokens = torch.zeros(64, 16, dtype=torch.long)
    losses = [process.loss(UniformLogits(), {"tokens": tokens}, g).loss for _ in range(batches)]
    return torch.stack(losses).double()


def test_importance_weights_keep_the_masked_bound_unbiased_under_a_bell():
    """With log(V - 1) nats per masked token the bound is closed-form: per token it is
    E_t[-keep'(t)] log(V - 1), t uniform on [t_min, 1], i.e. (keep(t_min) - keep(1)) /
    (1 - t_min) log(V - 1). The weighted bell draws land on it within 4 standard errors; the
    unweighted ones, crowded in the middle, miss it by ~40 (weights multiplied by the density
    instead of divided: by ~100)."""
    schedule, t_min = CosineMaskSchedule(eps=0.0), 1e-3
    keep = schedule.keep(torch.tensor([t_min, 1.0], dtype=torch.float64))
    exact = float((keep[0] - keep[1]) / (1 - t_min)) * math.log(V - 1)
    for weighted in (True, False):
        losses = masked_losses(weighted, batches=150)
        estimate, se = float(losses.mean()), float(losses.std()) / math.sqrt(len(losses))
        assert (abs(estimate - exact) < 4 * se) == weighted, (weighted, estimate, exact, se)


def test_every_default_time_sampler_covers_every_level():
    assert TimeSampler().covers_all_levels and Bell().covers_all_levels
